"""The server `ctxapp web` runs (uvicorn with its h11 parser): an HTTP method it does not know
reaches the application and is answered in our JSON error shape, not in plain text; and an idle
keep-alive connection outlives a client's own idle limit."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings

from ctxapp.cli.processes import KEEP_ALIVE_SECONDS, web_argv
from memory.models import Tenant
from memory.services.tenancy import api_key_create
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


def read_response(conn: socket.socket) -> bytes:
    """One whole answer (its head and Content-Length bytes of body) from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return data


def test_an_unknown_method_answers_the_json_error_shape(transactional_db) -> None:
    tenant = Tenant.objects.create(name="t", slug="methods")
    key_header = f"Authorization: Bearer {api_key_create(tenant=tenant, name='k')[1]}\r\n".encode()
    with uvicorn_server(worker_env(), argv=lambda port: web_argv(settings.CTXAPP, "127.0.0.1", port)) as base:
        for auth, expected in ((b"", ("unauthenticated", 401)), (key_header, ("method_not_allowed", 405))):
            request = (
                b"FOO /api/v1/tenant HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" + auth + b"\r\n"
            )
            status, headers, body = raw_request(base, request)
            assert headers["content-type"] == "application/json", (headers, body)
            error = json.loads(body)["error"]
            assert (error["code"], status) == expected, (status, error)
            assert set(error) == {"code", "message", "details"}
        # Requests the parser reads still reach the application as before.
        known = httpx.request("PATCH", f"{base}/api/v1/tenant")
        assert known.status_code == 401 and known.json()["error"]["code"] == "unauthenticated"


def test_an_idle_keep_alive_connection_outlives_an_httpx_clients_idle_limit(transactional_db) -> None:
    """httpx keeps an idle connection 5 s (`keepalive_expiry`), uvicorn's default too: the server
    could close one just as the client sent on it (a reset append in the soak drill). The server
    must keep it open past the client's limit, so it is the client that lets it go."""
    client_idle_limit = httpx.Limits().keepalive_expiry or 0.0
    assert KEEP_ALIVE_SECONDS > 60 > client_idle_limit  # and past a load balancer's usual 60 s
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with uvicorn_server(worker_env(), argv=lambda port: web_argv(settings.CTXAPP, "127.0.0.1", port)) as base:
        address = urlsplit(base)
        with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
            conn.sendall(request)
            assert read_response(conn).startswith(b"HTTP/1.1 200")
            # Idle past the client's limit, watching for the server closing the connection.
            deadline = time.monotonic() + client_idle_limit + 1.5
            while (left := deadline - time.monotonic()) > 0:
                readable, _, _ = select.select([conn], [], [], left)
                assert not readable, "the server closed the idle connection (or sent unasked)"
            conn.sendall(request)
            assert read_response(conn).startswith(b"HTTP/1.1 200")  # the same connection still serves
