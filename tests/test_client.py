"""The Python client against a live server: retries with one Idempotency-Key lose and duplicate nothing.

The network faults are injected with an httpx transport wrapper (the server and database are real):
a response is dropped AFTER the server committed the write, or a request fails before it is sent.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections import Counter
from typing import Any

import httpx
import pytest

from ctxapp import client as ctx
from memory.models import Event, Message, Session
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)


class FlakyTransport(httpx.HTTPTransport):
    """Loses the response of every `every`-th write after the server handled it (once per key),
    and fails every `every + 2`-th write before sending it (once per key)."""

    def __init__(self, every: int = 3) -> None:
        super().__init__()
        self.every = every
        self.lock = threading.Lock()
        self.writes = 0
        self.faulted: set[str] = set()
        self.keys: Counter[str] = Counter()
        self.dropped = 0
        self.refused = 0
        self.replayed = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("Idempotency-Key")
        fault = None
        if key is not None:
            with self.lock:
                self.keys[key] += 1
                if key not in self.faulted:
                    self.writes += 1
                    if self.writes % self.every == 0:
                        fault = "drop"
                    elif self.writes % (self.every + 2) == 0:
                        fault = "refuse"
                    if fault:
                        self.faulted.add(key)
        if fault == "refuse":
            with self.lock:
                self.refused += 1
            raise httpx.ConnectError("injected: connection refused", request=request)
        response = super().handle_request(request)
        if fault == "drop":
            response.read()
            response.close()
            with self.lock:
                self.dropped += 1
            raise httpx.ReadError("injected: response lost after the server handled it", request=request)
        if response.headers.get("Idempotent-Replayed") == "true":
            with self.lock:
                self.replayed += 1
        return response


class AsyncFlakyTransport(httpx.AsyncHTTPTransport):
    """The asyncio twin of FlakyTransport (same fault pattern)."""

    def __init__(self, every: int = 3) -> None:
        super().__init__()
        self.every = every
        self.writes = 0
        self.faulted: set[str] = set()
        self.dropped = 0
        self.refused = 0
        self.replayed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("Idempotency-Key")
        fault = None
        if key is not None and key not in self.faulted:
            self.writes += 1
            if self.writes % self.every == 0:
                fault = "drop"
            elif self.writes % (self.every + 2) == 0:
                fault = "refuse"
            if fault:
                self.faulted.add(key)
        if fault == "refuse":
            self.refused += 1
            raise httpx.ConnectError("injected: connection refused", request=request)
        response = await super().handle_async_request(request)
        if fault == "drop":
            await response.aread()
            await response.aclose()
            self.dropped += 1
            raise httpx.ReadError("injected: response lost after the server handled it", request=request)
        if response.headers.get("Idempotent-Replayed") == "true":
            self.replayed += 1
        return response


class Status503Once(httpx.HTTPTransport):
    """Answers 503 to the first attempt of each write without sending it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("Idempotency-Key", "")
        self.seen.append(key)
        if key and self.seen.count(key) == 1:
            return httpx.Response(
                503, json={"error": {"code": "unavailable", "message": "try later", "details": {}}}
            )
        return super().handle_request(request)


@pytest.fixture
def secret(tenant_a: Any) -> str:
    return api_key_create(tenant=tenant_a, name="client-test")[1]


def test_threaded_sync_clients_with_lost_responses_write_each_message_once(
    live_server: Any, secret: str, tenant_a: Any
) -> None:
    """The sync Client under threads: 4 clients x 30 appends, with the same faults injected."""
    setup = ctx.Client(live_server.url, secret)
    session_id = setup.session_create("threaded-bot")["id"]
    transport = FlakyTransport(every=3)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run(worker: int) -> None:
        api = ctx.Client(live_server.url, secret, transport=transport, retries=10)
        try:
            start.wait()
            for i in range(30):
                api.message_append(session_id, role="user", content=f"client {worker} message {i}")
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            api.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert transport.dropped >= 30 and transport.refused >= 10  # the faults really happened
    assert transport.replayed >= transport.dropped  # each lost response came back as a replay
    seqs = list(
        Message.objects.filter(session__public_id=session_id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, 121))
    contents = Counter(
        Message.objects.filter(session__public_id=session_id).values_list("content", flat=True)
    )
    assert len(contents) == 120 and set(contents.values()) == {1}
    assert [m["seq"] for m in setup.messages_iter(session_id)] == list(range(1, 121))
    setup.close()


def test_a_5xx_is_retried_with_the_same_idempotency_key(live_server: Any, secret: str) -> None:
    transport = Status503Once()
    with ctx.Client(live_server.url, secret, transport=transport) as api:
        session = api.session_create("bot", user_id="u-1", model="gpt-4o")
        assert transport.seen[0] == transport.seen[1] != ""
        assert Session.objects.filter(public_id=session["id"]).count() == 1
        appended = api.messages_append(
            session["id"], [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
        )
        assert (appended["first_seq"], appended["last_seq"]) == (1, 2)
        assert Message.objects.count() == 2


def test_errors_map_to_exceptions_by_code(live_server: Any, secret: str) -> None:
    with ctx.Client(live_server.url, secret, retries=0) as api:
        with pytest.raises(ctx.NotFound) as missing:
            api.session_get("sess_000000000000000000000000")
        assert missing.value.status == 404 and missing.value.code == "not_found"
        session = api.session_create("bot")
        with pytest.raises(ctx.ValidationFailed) as invalid:
            api.messages_append(session["id"], [{"role": "user", "content": "ok"}, {"role": "alien"}])
        assert invalid.value.status == 422 and "messages[1].role" in invalid.value.details["fields"]
        api.message_append(session["id"], role="user", content="hi", idempotency_key="k1")
        with pytest.raises(ctx.IdempotencyConflict):
            api.message_append(session["id"], role="user", content="other", idempotency_key="k1")
        with pytest.raises(ctx.NotFound) as no_session:
            api.agent_latest_session("ghost")
        api.event_emit("ghost", "agent.booted", {"v": 1})
        with pytest.raises(ctx.NotFound) as no_session:
            api.agent_latest_session("ghost")
        assert no_session.value.code == "no_session"
        ended = api.session_end(session["id"])
        assert ended["status"] == "ended"
        with pytest.raises(ctx.SessionEnded) as gone:
            api.message_append(session["id"], role="user", content="late")
        assert isinstance(gone.value, ctx.Conflict) and gone.value.status == 409
        task = api.task_create(session=session["id"], input="x")
        api.task_update(task["id"], status="failed", output="boom")
        with pytest.raises(ctx.TaskFinished):
            api.task_update(task["id"], status="succeeded")
        assert [t["status"] for t in api.tasks_list(session=session["id"])["items"]] == ["failed"]
        assert [e["type"] for e in api.events_iter("bot")][-2:] == ["task.created", "task.completed"]
        assert [s["id"] for s in api.sessions_iter(agent="bot")] == [session["id"]]
        api.session_delete(session["id"])
        with pytest.raises(ctx.NotFound):
            api.session_get(session["id"])
    with ctx.Client(live_server.url, "ctx_nope_nope", retries=0) as stranger:
        with pytest.raises(ctx.Unauthorized) as refused:
            stranger.sessions_list()
        assert refused.value.status == 401


def test_network_failure_after_all_retries_is_a_network_error() -> None:
    with ctx.Client("http://127.0.0.1:9", "ctx_x_y", retries=1, timeout=2) as api:
        with pytest.raises(ctx.NetworkError) as failed:
            api.sessions_list()
        assert failed.value.code == "network_error" and failed.value.status == 0


def test_the_async_client(live_server: Any, secret: str) -> None:
    async def scenario() -> list[int]:
        async with ctx.AsyncClient(live_server.url, secret) as api:
            session = await api.session_create("async-bot")
            await asyncio.gather(
                *(api.message_append(session["id"], role="user", content=str(i)) for i in range(10))
            )
            await api.messages_append(session["id"], [{"role": "assistant", "content": "done"}])
            with pytest.raises(ctx.ValidationFailed):
                await api.event_emit("async-bot", "not-agent.x")
            return [m["seq"] async for m in api.messages_iter(session["id"])]

    assert asyncio.run(scenario()) == list(range(1, 12))
    assert Message.objects.filter(session__agent__external_id="async-bot").count() == 11


def test_the_client_imports_without_django_or_celery() -> None:
    code = (
        "import sys, ctxapp.client; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'celery', 'rest_framework')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_twenty_concurrent_clients_with_lost_responses_get_seq_1_to_1000_without_gap_or_duplicate(
    live_server: Any, secret: str, tenant_a: Any
) -> None:
    """20 AsyncClients append 50 messages each to one session while the network loses every third
    response after the server committed it (and refuses some requests before sending): the
    retries reuse their Idempotency-Key, so seq is exactly 1..1000 and every message is stored once."""
    transport = AsyncFlakyTransport(every=3)

    async def scenario() -> str:
        async with ctx.AsyncClient(live_server.url, secret) as setup:
            session_id = (await setup.session_create("busy-async-bot"))["id"]

        # retries=10: besides the injected faults, Django's test server (listen backlog 10,
        # one connection per request) resets connections under this load; those are retried too.
        async def run(worker: int) -> None:
            async with ctx.AsyncClient(live_server.url, secret, transport=transport, retries=10) as api:
                for i in range(50):
                    await api.message_append(session_id, role="user", content=f"client {worker} message {i}")

        await asyncio.gather(*(run(n) for n in range(20)))
        return session_id

    session_id = asyncio.run(scenario())
    assert transport.dropped > 300 and transport.refused > 100  # the faults really happened
    assert transport.replayed >= transport.dropped  # each lost response came back as a replay
    seqs = list(
        Message.objects.filter(session__public_id=session_id).order_by("seq").values_list("seq", flat=True)
    )
    assert seqs == list(range(1, 1001))
    contents = Counter(
        Message.objects.filter(session__public_id=session_id).values_list("content", flat=True)
    )
    assert len(contents) == 1000 and set(contents.values()) == {1}
    added = Event.objects.filter(tenant=tenant_a, type="message.added", session__public_id=session_id)
    assert sorted(e.payload["seq"] for e in added) == list(range(1, 1001))
    assert Session.objects.get(public_id=session_id).message_seq == 1000
