"""A worker's events reach a web process's dashboards through the Redis channel layer.

A separate process configured like a Celery worker (the test database, the suite's Redis engine)
sends through memory.services.broadcast, and a receiver in this process, subscribed to the
tenant's group as a dashboard consumer is, gets every message in order.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from channels.layers import get_channel_layer

from memory.services import broadcast
from tests.conftest import worker_env

SENDER = """
import django
django.setup()
from memory.services import broadcast
for i in range(3):
    broadcast.send({tenant_id}, [{{"type": "message.added", "i": i}}])
"""


@pytest.mark.django_db(transaction=True)
def test_worker_events_reach_a_dashboard_group(tenant_a: Any) -> None:
    layer = get_channel_layer()

    async def receive_three() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(broadcast.tenant_group(tenant_a.pk), channel)
        sender = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            SENDER.format(tenant_id=tenant_a.pk),
            env=worker_env(),
            stderr=subprocess.PIPE,
        )
        received = [await asyncio.wait_for(layer.receive(channel), 30) for _ in range(3)]
        _, stderr = await sender.communicate()
        assert sender.returncode == 0, stderr.decode()
        return received

    received = asyncio.run(receive_three())
    assert [message["type"] for message in received] == ["ctx.events"] * 3
    assert [message["events"][0]["i"] for message in received] == [0, 1, 2]
