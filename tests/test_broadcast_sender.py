"""Outside a web server, live updates leave through one background sender per process.

With the real Redis channel layer and no server loop (as in a Celery worker, a management
command, the in-process client): a committed write reaches a real group listener; the commit does
not wait for the send (a layer whose Redis is unreachable neither slows it nor raises, it logs, and
the next send works); a forked child gets its own sender and its sends arrive; and a process that
sends just before it exits still delivers (the atexit flush).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.test import override_settings

from ctxapp.infra import broadcast
from memory.services import recorder
from tests.conftest import worker_env

pytestmark = pytest.mark.skipif(
    "Redis" not in settings.CHANNEL_LAYERS["default"]["BACKEND"], reason="the Redis channel layer's path"
)


class Listener:
    """A channel in the tenant's group, as a dashboard consumer's is, on a loop of its own."""

    def __init__(self, group: str) -> None:
        self.layer = get_channel_layer()  # the instance its channel belongs to
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.group = group
        self.channel = self.run(self.layer.new_channel())
        self.run(self.layer.group_add(group, self.channel))

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def types(self, count: int, timeout: float = 20) -> list[str]:
        """The event types of the next messages, until `count` events (polls under a deadline)."""

        async def receive() -> list[str]:
            types: list[str] = []
            async with asyncio.timeout(timeout):
                while len(types) < count:
                    message = await self.layer.receive(self.channel)
                    types += [event["type"] for event in message["events"]]
            return types

        return list(self.run(receive(), timeout + 5))

    def close(self) -> None:
        self.run(self.layer.group_discard(self.group, self.channel))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def listener(tenant_a: Any) -> Iterator[Listener]:
    listener = Listener(broadcast.tenant_group(tenant_a.pk))
    yield listener
    listener.close()


@pytest.fixture(autouse=True)
def no_server_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broadcast, "_server_loop", None)


@pytest.mark.django_db(transaction=True)
def test_a_write_outside_a_web_server_reaches_a_dashboard(tenant_a: Any, listener: Listener) -> None:
    with transaction.atomic():
        recorder.event_append(tenant=tenant_a, type="agent.first")
    broadcast.on_commit(tenant_a.pk, {"type": "agent.autocommit"})  # no transaction: sent at once

    assert listener.types(2) == ["agent.first", "agent.autocommit"]
    sender = broadcast._sender
    assert sender is not None and sender[0] == os.getpid()  # the background sender sent them


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once it is closed


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_layer_neither_holds_the_commit_nor_stops_later_sends(
    tenant_a: Any, listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = {
        "default": {
            **settings.CHANNEL_LAYERS["default"],
            "CONFIG": {
                **settings.CHANNEL_LAYERS["default"]["CONFIG"],
                "hosts": [f"redis://127.0.0.1:{closed_port()}/0"],
            },
        }
    }
    caplog.set_level(logging.WARNING, logger=broadcast.__name__)
    with override_settings(CHANNEL_LAYERS=unreachable):
        started = time.monotonic()
        with transaction.atomic():
            recorder.event_append(tenant=tenant_a, type="agent.lost")
        assert time.monotonic() - started < 1.0  # the commit only handed it on
        assert broadcast.flush_pending(30)
    assert any("was not sent" in record.getMessage() for record in caplog.records)

    with transaction.atomic():  # the real layer again (Redis "back"): this one arrives
        recorder.event_append(tenant=tenant_a, type="agent.after")
    assert listener.types(1) == ["agent.after"]


@pytest.mark.django_db(transaction=True)
def test_a_forked_child_sends_through_a_sender_of_its_own(tenant_a: Any, listener: Listener) -> None:
    broadcast.on_commit(tenant_a.pk, {"type": "parent.before"})  # the parent's sender exists
    assert listener.types(1) == ["parent.before"]
    parent_sender = broadcast._sender

    pid = os.fork()
    if pid == 0:  # the child: no database, only the channel layer
        code = 1
        try:
            broadcast.on_commit(tenant_a.pk, {"type": "child.sent"})
            own = broadcast._sender
            code = 0 if own is not None and own[0] == os.getpid() and own is not parent_sender else 2
            if not broadcast.flush_pending(20):
                code = 3
        finally:
            os._exit(code)  # as a Celery prefork child ends: no atexit, no pytest teardown
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert listener.types(1) == ["child.sent"]

    broadcast.on_commit(tenant_a.pk, {"type": "parent.after"})  # the parent's sender is untouched
    assert broadcast._sender is parent_sender
    assert listener.types(1) == ["parent.after"]


EXITING = """
import django
django.setup()
from ctxapp.infra import broadcast
broadcast.on_commit({tenant_id}, {{"type": "cli.last_words"}})
"""  # and exits at once: only the atexit flush sends it


@pytest.mark.django_db(transaction=True)
def test_a_send_just_before_a_process_exits_is_delivered(tenant_a: Any, listener: Listener) -> None:
    env = worker_env()
    env["DJANGO_SETTINGS_MODULE"] = "ctxapp.settings_test"  # in Redis mode, on the test database
    env["CTXAPP_TEST_DATABASE_URL"] = env["DATABASE_URL"]
    done = subprocess.run(
        [sys.executable, "-c", EXITING.format(tenant_id=tenant_a.pk)],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert listener.types(1) == ["cli.last_words"]
