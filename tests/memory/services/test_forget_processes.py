"""Forget and redact with two web processes: what B cached for its searches is not served after A
redacted or erased it (the content generation in the corpus's version, memory/services/forget.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from django.conf import settings

from ctxapp.cli.processes import web_argv
from memory.models import Tenant
from memory.services import message_indexing
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def _ctxapp_web(port: int) -> list[str]:
    return web_argv(settings.CTXAPP, "127.0.0.1", port)


def _texts(client: httpx.Client, base: str, query: str) -> list[str]:
    body = {"query": query, "scope": {"user_id": "u1", "sessions": "all"}, "kinds": ["message"]}
    response = client.post(f"{base}/api/v1/memory/search", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return [r["text"] for r in response.json()["results"]]


def _eventually(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_b_serves_nothing_a_redacted_or_forgot(transactional_db: None) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, secret = api_key_create(tenant=tenant, name="admin", scopes=["admin"])
    headers = {"Authorization": f"Bearer {secret}"}
    with ExitStack() as stack:
        a = stack.enter_context(uvicorn_server(worker_env(), argv=_ctxapp_web))
        b = stack.enter_context(uvicorn_server(worker_env(), argv=_ctxapp_web))
        client = stack.enter_context(httpx.Client(headers=headers))
        sid = client.post(f"{a}/api/v1/sessions", json={"agent": "bot", "user_id": "u1"}).json()["id"]
        turns = ["The alarm code for the cabin is 4417.", "I keep my kayak in the cabin's shed.",
                 "My sister Lina gets married in Porto."]  # fmt: skip
        appended = client.post(
            f"{a}/api/v1/sessions/{sid}/messages",
            json={"messages": [{"role": "user", "content": t} for t in turns]},
        )
        assert appended.status_code == 201, appended.text
        message_indexing.memory_index_drain()
        assert any("alarm code" in t for t in _texts(client, b, "cabin alarm code"))  # B's corpus is warm
        assert any("kayak" in t for t in _texts(client, b, "kayak"))

        redacted = client.post(f"{a}/api/v1/sessions/{sid}/messages/1/redact", json={})
        assert redacted.status_code == 200, redacted.text
        # Embedded again before B looks: B's row count, newest id and vector count are as they were.
        message_indexing.memory_index_drain()
        _eventually(
            lambda: not any("alarm code" in t for t in _texts(client, b, "cabin alarm code 4417")),
            "B still serves the redacted text",
        )

        forgotten = client.delete(f"{a}/api/v1/users/u1")
        assert forgotten.status_code == 200 and forgotten.json()["counts"]["messages"] == 3
        _eventually(lambda: _texts(client, b, "kayak cabin Lina Porto") == [], "B still serves the user")
        again: Any = client.delete(f"{b}/api/v1/users/u1")
        assert again.status_code == 200 and set(again.json()["counts"].values()) == {0}
