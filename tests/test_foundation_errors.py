"""A failure on our side is a JSON 500 on /api paths (and Django's page elsewhere), never a traceback.

This module is also the URLconf of its tests: the real routes plus two views that fail on
purpose, wired only here (override_settings(ROOT_URLCONF=__name__)).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse
from django.test import override_settings
from django.urls import path
from rest_framework.response import Response
from rest_framework.test import APIClient

from ctxapp.urls import urlpatterns as real_urlpatterns
from memory.api.base import TenantApiView
from memory.models import Tenant

handler404 = "ctxapp.api_errors.handler404"
handler500 = "ctxapp.api_errors.handler500"


class ExplodingApi(TenantApiView):
    """Writes a row, then fails: the write must not survive (inside the view's transaction)."""

    def post(self, request: Any) -> Response:
        with transaction.atomic():
            Tenant.objects.create(name="half-written", slug="half-written")
            raise RuntimeError("boom: a bug on our side")


class DatabaseGoneApi(TenantApiView):
    """Writes a row, then PostgreSQL gives up on the statement: a real OperationalError, as when
    the database restarts under a request or the pool times out."""

    def post(self, request: Any) -> Response:
        with transaction.atomic():
            Tenant.objects.create(name="half-written", slug="half-written")
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL statement_timeout = 1")
                cursor.execute("SELECT pg_sleep(1)")
        return Response({})


def exploding_plain_view(request: HttpRequest) -> HttpResponse:
    raise ValueError("a bug outside DRF")


urlpatterns = [
    path("api/v1/test-only/explode", ExplodingApi.as_view()),
    path("api/v1/test-only/database-gone", DatabaseGoneApi.as_view()),
    path("api/v1/test-only/plain", exploding_plain_view),
    path("test-only/plain", exploding_plain_view),
    *real_urlpatterns,
]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def assert_internal_error(response: Any) -> None:
    assert response.status_code == 500
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == "internal_error"
    assert body["error"]["message"]
    assert body["error"]["details"] == {}
    assert "boom" not in response.content.decode() and "Traceback" not in response.content.decode()


def test_an_unexpected_error_in_an_api_view_is_a_json_500(make_client: Any, tenant_a: Tenant) -> None:
    client = make_client(tenant_a, ["write"])
    client.raise_request_exception = False
    response = client.post("/api/v1/test-only/explode", {}, format="json")
    assert_internal_error(response)
    assert not Tenant.objects.filter(slug="half-written").exists()


def test_a_database_that_goes_away_answers_503_and_applies_nothing(
    make_client: Any, tenant_a: Tenant
) -> None:
    client = make_client(tenant_a, ["write"])
    client.raise_request_exception = False
    response = client.post("/api/v1/test-only/database-gone", {}, format="json")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "database_unavailable"
    assert response["Retry-After"] == "5"
    assert not Tenant.objects.filter(slug="half-written").exists()


def test_an_unexpected_error_with_an_idempotency_key_stores_nothing(
    make_client: Any, tenant_a: Tenant
) -> None:
    from memory.models import IdempotencyRecord

    client = make_client(tenant_a, ["write"])
    client.raise_request_exception = False
    response = client.post("/api/v1/test-only/explode", {}, format="json", HTTP_IDEMPOTENCY_KEY="retry-me")
    assert_internal_error(response)
    # Nothing remembered: a retry with the same key runs again instead of replaying the failure.
    assert not IdempotencyRecord.objects.filter(key="retry-me").exists()
    assert not Tenant.objects.filter(slug="half-written").exists()


def test_an_unexpected_error_outside_drf_on_an_api_path_is_a_json_500() -> None:
    client = APIClient(raise_request_exception=False)
    response = client.get("/api/v1/test-only/plain")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"


def test_an_unexpected_error_on_a_page_is_django_html_500() -> None:
    client = APIClient(raise_request_exception=False)
    response = client.get("/test-only/plain")
    assert response.status_code == 500
    assert not response["Content-Type"].startswith("application/json")


@override_settings(DEBUG=False)
def test_handlers_answer_json_directly() -> None:
    from django.test import RequestFactory

    from ctxapp import api_errors

    request = RequestFactory().get("/api/v1/anything")
    assert api_errors.handler500(request).status_code == 500
    not_found = api_errors.handler404(request)
    assert not_found.status_code == 404
    assert b'"not_found"' in not_found.content
