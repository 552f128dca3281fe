"""The only module that talks to the channel layer: live updates for the tenant's dashboards.

A write hands its events to `on_commit` inside its transaction; after the commit they go to the
tenant's group with one `group_send` (Channels' documented way to reach a group from synchronous
code: `transaction.on_commit` → `async_to_sync(channel_layer.group_send)`). A rolled-back write is
never shown, and a batch of 1,000 messages is one send, not 1,000.

Live updates are best effort: a send that fails, or that Redis does not answer within
SEND_TIMEOUT_SECONDS, is logged and dropped, never raised, so a committed write is never held or
failed by its live update. A dashboard that missed one catches up at the next, which re-renders
its panels from the database.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 2.0
# One channel-layer message carries at most this many events.
MAX_ITEMS_PER_SEND = 1000


def tenant_group(tenant_id: int) -> str:
    return f"{settings.QUEUE_PREFIX}.tenant.{tenant_id}"


def on_commit(tenant_id: int, items: Iterable[dict[str, Any]]) -> None:
    """Send `items` to the tenant's dashboards once the current transaction commits (at once
    outside a transaction). Never raises because of the channel layer."""
    items = list(items)
    if items:
        transaction.on_commit(partial(send, tenant_id, items))


def is_live_update(callback: Any) -> bool:
    """Whether an on-commit callback is one of this module's sends (for a caller counting a
    transaction's other on-commit work)."""
    return isinstance(callback, partial) and callback.func is send


def send(tenant_id: int, items: list[dict[str, Any]]) -> None:
    """Send `items` to the tenant's dashboards now, waiting at most SEND_TIMEOUT_SECONDS per
    message. Failures are logged, not raised."""
    layer = get_channel_layer()
    if layer is None:
        return
    group = tenant_group(tenant_id)
    for start in range(0, len(items), MAX_ITEMS_PER_SEND):
        message = {"type": "ctx.events", "events": items[start : start + MAX_ITEMS_PER_SEND]}
        try:
            async_to_sync(_send_bounded)(layer, group, message)
        except Exception as exc:  # a dashboard push must never fail or hold a committed write
            logger.warning(
                "live update for tenant %s was not sent: %s: %s", tenant_id, type(exc).__name__, exc
            )
            return


async def _send_bounded(layer: Any, group: str, message: dict[str, Any]) -> None:
    await asyncio.wait_for(layer.group_send(group, message), SEND_TIMEOUT_SECONDS)
