"""The Redis-less channel layer carries a worker's events to a web process's dashboards.

`ctxapp up` without REDIS_URL uses channels_postgres. Here a separate process configured exactly
like such a worker (no REDIS_URL, the test database) broadcasts through ctxapp.infra.broadcast, and a
receiver in this process, subscribed to the tenant's group as a dashboard consumer is, gets them.
"""

from __future__ import annotations

import asyncio
import importlib
import subprocess
import sys
import time
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import worker_env

SENDER = """
import django
django.setup()
from django.conf import settings
from ctxapp.infra import broadcast
assert settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("PostgresChannelLayer"), settings.CHANNEL_LAYERS
for i in range(3):
    broadcast.send({tenant_id}, [{{"type": "message.added", "i": i}}])
"""


@pytest.mark.django_db(transaction=True)
def test_worker_events_reach_a_dashboard_group_without_redis(tenant_a: Any) -> None:
    from ctxapp.infra import broadcast
    from ctxapp.infra.channel_layer import PostgresChannelLayer

    # Tests build tables from the models (--nomigrations); channels_postgres's NOTIFY trigger
    # comes from its migrations, which `ctxapp up` runs: install it the same way here.
    latest = importlib.import_module("channels_postgres.migrations.0004_notify_ensure_payload_not_too_big")
    with connection.cursor() as cursor:
        cursor.execute(latest.Migration.setup_database_sql)

    config = {**connection.settings_dict, "TIME_ZONE": None, "prefix": f"{settings.QUEUE_PREFIX}_asgi"}
    layer = PostgresChannelLayer(**{k: v for k, v in config.items() if k != "BACKEND"})
    env = worker_env()
    env.pop("REDIS_URL", None)

    async def receive_three() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(broadcast.tenant_group(tenant_a.pk), channel)
        first = asyncio.ensure_future(layer.receive(channel))
        # The layer's listener drops a notification for a channel whose advisory lock it does not
        # hold yet: wait until the receiver holds the lock and listens before the worker sends.
        deadline = time.monotonic() + 30
        while not layer.is_listening(channel):
            assert time.monotonic() < deadline, "the channel layer never started listening"
            await asyncio.sleep(0.01)
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-c", SENDER.format(tenant_id=tenant_a.pk), env=env, stderr=subprocess.PIPE
        )
        received = [await asyncio.wait_for(first, 30)]
        while len(received) < 3:
            received.append(await asyncio.wait_for(layer.receive(channel), 30))
        _, stderr = await sender.communicate()
        assert sender.returncode == 0, stderr.decode()
        # Close the layer's pool so the test database can go.
        await layer.close()
        return received

    received = asyncio.run(receive_three())
    assert [message["type"] for message in received] == ["ctx.events"] * 3
    assert [message["events"][0]["i"] for message in received] == [0, 1, 2]
