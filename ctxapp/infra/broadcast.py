"""The only module that talks to the channel layer.

Services never push live updates directly: `event_append` (memory.services.recorder) queues every
recorded event here, and the queue is handed on when the transaction commits. A rolled-back write
therefore never shows up on a dashboard, and a batch of 1,000 messages costs one channel-layer
send, not 1,000.

In a web process the send happens off the request: the ASGI application tells this module its
server's event loop (`use_loop`), and a committed write only hands its events to that loop. So a
slow or unreachable channel layer (Redis restarting, a busy PostgreSQL) never holds an API write;
the loop sends on the same loop the dashboard consumers use, and what queues up while a send is
in flight goes out together, one message per tenant. (Throughput is unchanged within noise: the
send's CPU is spent in the same process either way; bench/bench_ingest.py.) Elsewhere (Celery
workers, management commands, tests through Django's test client) there is no server loop and
the send happens at commit, in the committing thread. Live updates are best effort either way: a
channel-layer failure is logged, never raised.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from ctxapp.infra.commit_batch import CommitBatch

logger = logging.getLogger(__name__)

# One channel-layer message carries at most this many events (a batch of 1,000 messages is one).
MAX_ITEMS_PER_SEND = 1000
_server_loop: asyncio.AbstractEventLoop | None = None
_loop_pending: dict[int, list[dict[str, Any]]] = {}  # touched only on _server_loop
_loop_draining: list[asyncio.Task[None]] = []  # the running drain task, if any


def tenant_group(tenant_id: int) -> str:
    return f"{settings.QUEUE_PREFIX}.tenant.{tenant_id}"


def on_commit(tenant_id: int, item: dict[str, Any]) -> None:
    """Queue `item` for the tenant's dashboards; it is sent after the current transaction commits.

    Outside a transaction it is sent at once. Never raises because of the channel layer.
    """
    live_updates.add((tenant_id, item))


def listeners_sql(tenant_id: int, placeholder: str = "%s") -> tuple[str, str] | None:
    """Whether the tenant's dashboards listen, for a write to ask inside its own statement: a
    boolean SQL expression with one parameter (written as `placeholder`) and that parameter's
    value. None when the channel layer cannot be asked in SQL (Redis, none): then the write sends.

    A write that finds no listener skips its send. A page that joins between that statement and
    its commit misses this one update and catches up as after any missed update: the next event
    re-renders its panels from the database (and so does its `hello` on connect).
    """
    layer = get_channel_layer()
    members_sql = getattr(layer, "members_sql", None)
    return None if members_sql is None else members_sql(tenant_group(tenant_id), placeholder)


def use_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Send live updates on `loop` (the ASGI server's, where the dashboard consumers run)."""
    global _server_loop
    _server_loop = loop


def _flush(items: list[tuple[int, dict[str, Any]]]) -> None:
    pending: dict[int, list[dict[str, Any]]] = {}
    for tenant_id, item in items:
        pending.setdefault(tenant_id, []).append(item)
    _dispatch(pending)


live_updates: CommitBatch[tuple[int, dict[str, Any]]] = CommitBatch(_flush)


def _dispatch(pending: dict[int, list[dict[str, Any]]]) -> None:
    loop = _server_loop
    if loop is not None and loop.is_running():
        try:
            loop.call_soon_threadsafe(_enqueue, pending)
            return
        except RuntimeError:  # the loop closed in between: send from here
            pass
    for tenant_id, items in pending.items():
        send(tenant_id, items)


def send(tenant_id: int, items: list[dict[str, Any]]) -> None:
    """Send `items` to the tenant's dashboards now, from this thread (waits for the channel layer).

    Outside a transaction (after a commit, where the batch is flushed) the PostgreSQL layer sends
    in one statement on this thread's database connection (`group_send_sync`); otherwise it goes
    through `async_to_sync`, which starts a thread and an event loop per call (2-3 ms of an
    in-process append, docs/benchmarks.md, bench_peers.py) but can never abort the caller's
    transaction.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "ctx.events", "events": items}
    try:
        if hasattr(layer, "group_send_sync") and not connection.in_atomic_block:
            layer.group_send_sync(connection, tenant_group(tenant_id), message)
        else:
            async_to_sync(layer.group_send)(tenant_group(tenant_id), message)
    except Exception:  # a dashboard push must never fail a committed write
        logger.warning("live update for tenant %s was not sent", tenant_id, exc_info=True)


def _enqueue(pending: dict[int, list[dict[str, Any]]]) -> None:
    # On the server loop: merge into what waits, and start a drain unless one is running.
    for tenant_id, items in pending.items():
        _loop_pending.setdefault(tenant_id, []).extend(items)
    if not _loop_draining or _loop_draining[0].done():
        _loop_draining[:] = [asyncio.get_running_loop().create_task(_drain())]


async def _drain() -> None:
    layer = get_channel_layer()
    while _loop_pending:
        batch = dict(_loop_pending)
        _loop_pending.clear()
        if layer is None:
            continue
        for tenant_id, items in batch.items():
            for start in range(0, len(items), MAX_ITEMS_PER_SEND):
                message = {"type": "ctx.events", "events": items[start : start + MAX_ITEMS_PER_SEND]}
                try:
                    await layer.group_send(tenant_group(tenant_id), message)
                except Exception:  # a dashboard push must never fail a committed write
                    logger.warning("live update for tenant %s was not sent", tenant_id, exc_info=True)
