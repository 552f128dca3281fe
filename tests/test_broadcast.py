"""Live updates leave a web process on its server loop, after commit, without holding the request.

In a web process the ASGI application hands ctxapp.infra.broadcast its event loop. Proves, with the real
(Redis) channel layer and a loop running in a thread as uvicorn's does: a committed write returns
before its live update is sent (the send is held here until released), nothing of a rolled-back
write is sent, and the updates arrive in commit order.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.db import transaction

from ctxapp.infra import broadcast
from memory.services import recorder


@pytest.fixture
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def on_loop(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(30)


@pytest.mark.django_db(transaction=True)
def test_a_commit_does_not_wait_for_its_live_update(
    tenant_a: Any, server_loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = get_channel_layer()
    group = broadcast.tenant_group(tenant_a.pk)
    channel = on_loop(server_loop, layer.new_channel())
    on_loop(server_loop, layer.group_add(group, channel))

    async def make_gate() -> asyncio.Event:
        return asyncio.Event()

    gate = on_loop(server_loop, make_gate())
    held: list[list[str]] = []
    real_group_send = layer.group_send

    async def held_group_send(name: str, message: dict[str, Any]) -> None:
        held.append([event["type"] for event in message["events"]])
        await gate.wait()  # the channel layer is "slow" until the test releases it
        await real_group_send(name, message)

    monkeypatch.setattr(layer, "group_send", held_group_send)
    monkeypatch.setattr(broadcast, "_server_loop", server_loop)

    with transaction.atomic():
        recorder.event_append(tenant=tenant_a, type="agent.first")
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:  # the loop picks it up and holds it
        time.sleep(0.01)
    with transaction.atomic():  # rolled back: never shown
        recorder.event_append(tenant=tenant_a, type="agent.rolled_back")
        transaction.set_rollback(True)
    with transaction.atomic():
        recorder.event_append(tenant=tenant_a, type="agent.second")

    # The later commits returned while the first send is still held on the loop; theirs waits.
    assert held == [["agent.first"]]

    async def release_and_receive() -> list[str]:
        gate.set()
        received: list[str] = []
        while len(received) < 2:
            message = await asyncio.wait_for(layer.receive(channel), 10)
            received.extend(event["type"] for event in message["events"])
        return received

    assert on_loop(server_loop, release_and_receive()) == ["agent.first", "agent.second"]
    on_loop(server_loop, layer.group_discard(group, channel))
