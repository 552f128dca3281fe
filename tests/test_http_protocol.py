"""A request the HTTP parser refuses is answered by the server itself, before the application: under
the server `ctxapp web` runs, that answer is our JSON error shape too, not uvicorn's plain text."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings

from ctxapp.cli.processes import web_argv
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def raw_request(base: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `request` as bytes on a new connection: (status, headers, body) of the answer."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        conn.sendall(request)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_an_unknown_method_and_a_malformed_request_answer_the_json_error_shape(transactional_db) -> None:
    with uvicorn_server(worker_env(), argv=lambda port: web_argv(settings.CTXAPP, "127.0.0.1", port)) as base:
        for request in (
            b"FOO /api/v1/tenant HTTP/1.1\r\nHost: localhost\r\n\r\n",
            b"GET /api/v1/tenant HTTP/1.1\r\nHost: localhost\r\nBad Header Line\r\n\r\n",
        ):
            status, headers, body = raw_request(base, request)
            assert status == 400, (request, body)
            assert headers["content-type"] == "application/json", headers
            error = json.loads(body)["error"]
            assert error["code"] == "bad_request" and "method" in error["message"], error
            assert error["details"] == {}
        # Requests the parser reads still reach the application as before.
        known = httpx.request("PATCH", f"{base}/api/v1/tenant")
        assert known.status_code == 401 and known.json()["error"]["code"] == "unauthenticated"
