"""/api/docs/ works without internet: Swagger UI comes from our own static files (the sidecar wheel)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from tests.helpers import body_of

pytestmark = pytest.mark.django_db


def test_api_docs_reference_only_local_urls_and_each_answers() -> None:
    client = Client()
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    urls = set(re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html))
    urls |= set(re.findall(r"""["'](/[^"'\s]+\.(?:js|css|png))["']""", html))
    assert any(url.endswith("swagger-ui-bundle.js") for url in urls), urls
    assert any(url.endswith("swagger-ui.css") for url in urls), urls
    assert not re.search(r"https?://|//cdn|jsdelivr|unpkg", html), "the page still loads something remote"
    for url in urls:
        assert url.startswith("/"), url
        response = client.get(url)
        assert response.status_code == 200, url
        body = body_of(response)
        assert len(body) > 100, url
    assert client.get("/api/schema/").status_code == 200  # what Swagger UI loads next
