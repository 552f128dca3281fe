"""Content-Security-Policy on the dashboard and the admin (no inline scripts), and CTXAPP_HTTPS."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

REPO = Path(__file__).resolve().parent.parent


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


@pytest.mark.django_db
def test_the_api_docs_page_runs_no_inline_script_under_its_own_policy():
    client = Client()
    response = client.get("/api/docs/")
    assert response.status_code == 200
    directives = policy(response)
    assert directives["script-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"]
    html = response.content.decode()
    scripts = re.findall(r"<script([^>]*)>", html)
    assert scripts and all("src=" in attributes for attributes in scripts), scripts  # none inline
    script_url = re.findall(r'<script src="([^"]*\?script[^"]*)"', html)[0].replace("&amp;", "&")
    script = client.get(script_url)
    assert script.status_code == 200 and b"SwaggerUIBundle" in script.content


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_dashboard_and_admin_pages_allow_only_our_own_scripts(url):
    response = Client().get(url)
    assert response.status_code == 200
    directives = policy(response)
    assert directives["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval'
    assert directives["style-src"] == ["'self'"]
    assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"]
    html = response.content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "an inline <script> on the page"


@pytest.mark.django_db
def test_the_api_is_left_out(api_a):
    assert "Content-Security-Policy" not in api_a.get("/api/v1/tenant")


def test_no_template_carries_an_inline_script_or_handler():
    offenders = []
    for path in (REPO / "templates").rglob("*.html"):
        text = path.read_text()
        if re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text) or re.search(r"\son[a-z]+\s*=", text):
            offenders.append(str(path.relative_to(REPO)))
        if re.search(r"\sstyle\s*=", text):
            offenders.append(f"{path.relative_to(REPO)} (inline style)")
    assert not offenders


def _settings_with(env: dict[str, str]) -> dict:
    code = (
        "import json, django; from django.conf import settings; django.setup(); "
        "print(json.dumps({k: getattr(settings, k, None) for k in ("
        "'SECURE_HSTS_SECONDS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_PROXY_SSL_HEADER')}))"
    )
    environ = {k: v for k, v in os.environ.items() if k != "CTXAPP_HTTPS"}
    environ.update({"DJANGO_SETTINGS_MODULE": "ctxapp.settings", "CTXAPP_SECRET_KEY": "x" * 50, **env})
    command = [sys.executable, "-c", code]
    out = subprocess.run(command, env=environ, capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_ctxapp_https_turns_on_hsts_and_secure_cookies(tmp_path):
    on = _settings_with({"CTXAPP_HTTPS": "true", "CTXAPP_DATA_DIR": str(tmp_path)})
    assert on["SECURE_HSTS_SECONDS"] == 31536000
    assert on["SESSION_COOKIE_SECURE"] is True and on["CSRF_COOKIE_SECURE"] is True
    assert on["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    off = _settings_with({"CTXAPP_DATA_DIR": str(tmp_path)})
    assert not off["SECURE_HSTS_SECONDS"] and off["SESSION_COOKIE_SECURE"] is False


@pytest.mark.django_db
def test_with_https_on_a_proxied_request_gets_hsts_and_secure_cookies(settings, carol_user):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31536000
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    client = Client(HTTP_X_FORWARDED_PROTO="https")
    page = client.get("/login/")
    assert page["Strict-Transport-Security"] == "max-age=31536000"
    assert page.cookies["csrftoken"]["secure"] is True
    logged = client.post("/login/", {"username": "carol", "password": "pw-carol-123"})
    assert logged.status_code == 302 and logged.cookies["sessionid"]["secure"] is True


@pytest.fixture
def carol_user(db):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(username="carol", password="pw-carol-123", is_staff=True)
