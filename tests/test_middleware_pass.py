"""Under ASGI an API request runs its middleware in one synchronous pass: the request thread is
entered once for the middleware, and Django's own switches (the view, the signals, closing the
response) are all that is left (20 switches per append before, ≈ 0.2 ms each)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref import sync
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from memory.models import Tenant
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db


def test_an_api_request_switches_threads_only_where_django_must(monkeypatch: Any, tenant_a: Tenant) -> None:
    secret = api_key_create(tenant=tenant_a, name="hops")[1]
    switches: list[str] = []
    enter = sync.SyncToAsync.__call__

    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        switches.append(getattr(self.func, "__qualname__", repr(self.func)))
        return await enter(self, *args, **kwargs)

    monkeypatch.setattr(sync.SyncToAsync, "__call__", counted)

    async def fetch() -> Any:
        return await AsyncClient().get("/api/v1/tenant", headers={"Authorization": f"Bearer {secret}"})

    response = async_to_sync(fetch)()
    assert response.status_code == 200, response.content
    assert response.json()["name"] == tenant_a.name
    assert response["X-Frame-Options"] == "DENY" and response["X-Content-Type-Options"] == "nosniff"
    # The middleware pass, the view, CSRF's view hook, the request signals, closing the response.
    assert len(switches) <= 6, switches
    assert not [name for name in switches if "process_request" in name or "process_response" in name]


def test_the_content_security_policy_is_built_only_where_it_is_sent(
    monkeypatch: Any, api_a: Any, client: Any
) -> None:
    import csp.middleware

    built: list[bool] = []
    build = csp.middleware.build_policy

    def counted(*args: Any, **kwargs: Any) -> str:
        built.append(True)
        return build(*args, **kwargs)

    monkeypatch.setattr(csp.middleware, "build_policy", counted)
    response = api_a.get("/api/v1/tenant")
    assert response.status_code == 200 and "Content-Security-Policy" not in response
    assert built == []  # /api/ is left out: nothing built (django-csp built both policies)
    page = client.get("/accounts/login/")
    assert "script-src 'self'" in page["Content-Security-Policy"] and built
