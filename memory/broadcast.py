"""The only module that talks to the channel layer.

Services never push live updates directly: `event_append` (memory.services.recorder) queues every
recorded event here, and the queue is flushed in ONE group message per tenant when the
transaction commits. A rolled-back write therefore never shows up on a dashboard, and a batch
of 1,000 messages costs one channel-layer send, not 1,000.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

_local = threading.local()


def tenant_group(tenant_id: int) -> str:
    from django.conf import settings

    return f"{settings.QUEUE_PREFIX}.tenant.{tenant_id}"


def on_commit(tenant_id: int, item: dict[str, Any]) -> None:
    """Queue `item` for the tenant's dashboards; it is sent after the current transaction commits.

    Outside a transaction it is sent at once. Never raises because of the channel layer.
    """
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        send(tenant_id, [item])
        return
    pending: dict[int, list[dict[str, Any]]] | None = getattr(_local, "pending", None)
    # After a rollback our flush callback is gone from the connection: start a new batch.
    if pending is None or not any(entry[1] is _flush for entry in connection.run_on_commit):
        pending = _local.pending = {}
        transaction.on_commit(_flush)
    pending.setdefault(tenant_id, []).append(item)


def _flush() -> None:
    pending: dict[int, list[dict[str, Any]]] = getattr(_local, "pending", None) or {}
    _local.pending = None
    for tenant_id, items in pending.items():
        send(tenant_id, items)


def send(tenant_id: int, items: list[dict[str, Any]]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(tenant_group(tenant_id), {"type": "ctx.events", "events": items})
    except Exception:  # a dashboard push must never fail a committed write
        logger.warning("live update for tenant %s was not sent", tenant_id, exc_info=True)
