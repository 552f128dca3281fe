"""The only module that talks to the channel layer.

Services never push live updates directly: `event_append` (memory.services.recorder) queues every
recorded event here, and the queue is handed on when the transaction commits. A rolled-back write
therefore never shows up on a dashboard, and a batch of 1,000 messages costs one channel-layer
send, not 1,000.

A committed write only hands its events to an event loop and returns; the loop sends them. So a
slow or unreachable channel layer (Redis restarting, a busy PostgreSQL) never holds a write, and
what queues up while a send is in flight goes out together, one message per tenant (in chunks of
MAX_ITEMS_PER_SEND). In a web process that loop is the ASGI server's (`use_loop`), where the
dashboard consumers run. Elsewhere (Celery workers, management commands, the in-process client,
tests through Django's test client) it is one background sender per process: a daemon thread
running its own loop, started on first need and again in a forked child (keyed by the process id,
so each Celery prefork child has its own). One long-lived loop is also what channels_redis wants:
it binds its connection pools to the loop they are used on, and `async_to_sync` per send would
start a thread and a loop each time (half of an in-process append's wall time with Redis,
docs/benchmarks.md). The PostgreSQL layer outside a web process keeps sending at commit in one
statement on the committing thread's own connection (`group_send_sync`), which costs less than
the hand-off.

Live updates are best effort: a channel-layer failure is logged, never raised, and the next send
tries again. Nothing is silently dropped at exit either: an `atexit` hook waits (at most
EXIT_FLUSH_SECONDS) for the background sender to send what is pending, so a CLI command that writes
and exits still reaches the dashboards.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import weakref
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from ctxapp.infra.commit_batch import CommitBatch

logger = logging.getLogger(__name__)

# One channel-layer message carries at most this many events (a batch of 1,000 messages is one).
MAX_ITEMS_PER_SEND = 1000
# How long a process's exit waits for its background sender to send what is pending.
EXIT_FLUSH_SECONDS = 2.0
_server_loop: asyncio.AbstractEventLoop | None = None
# The background sender of this process: (os.getpid(), its loop); see _sender_loop.
_sender: tuple[int, asyncio.AbstractEventLoop] | None = None
_sender_lock = threading.Lock()
# Per sending loop, touched only on that loop: what waits to be sent, by (layer, group).
_outboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Outbox] = weakref.WeakKeyDictionary()


def tenant_group(tenant_id: int) -> str:
    return f"{settings.QUEUE_PREFIX}.tenant.{tenant_id}"


def on_commit(tenant_id: int, item: dict[str, Any]) -> None:
    """Queue `item` for the tenant's dashboards; it is sent after the current transaction commits.

    Outside a transaction it is handed on at once. Never raises because of the channel layer.
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
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _server_loop
    if loop is None or not loop.is_running():
        if hasattr(layer, "group_send_sync") and not connection.in_atomic_block:
            for tenant_id, items in pending.items():
                send(tenant_id, items)
            return
        loop = _sender_loop()
    by_group = {(layer, tenant_group(tenant_id)): items for tenant_id, items in pending.items()}
    try:
        loop.call_soon_threadsafe(_enqueue, by_group)
    except RuntimeError:  # the server loop closed in between: the background sender sends
        _sender_loop().call_soon_threadsafe(_enqueue, by_group)


def send(tenant_id: int, items: list[dict[str, Any]]) -> None:
    """Send `items` to the tenant's dashboards now, from this thread (waits for the channel layer).

    Outside a transaction (after a commit, where the batch is flushed) the PostgreSQL layer sends
    in one statement on this thread's database connection (`group_send_sync`); otherwise it goes
    through `async_to_sync`, which starts a thread and an event loop per call but can never abort
    the caller's transaction. Committed writes do not come here for Redis (see the module's doc).
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


def _sender_loop() -> asyncio.AbstractEventLoop:
    """This process's background sender's loop, started on first need (and anew after a fork:
    a forked child inherits the parent's variables but not its thread)."""
    global _sender
    with _sender_lock:
        if _sender is None or _sender[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="ctxapp-live-updates", daemon=True).start()
            _sender = (os.getpid(), loop)
        return _sender[1]


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock at the fork: the child gets a free one.
    global _sender_lock
    _sender_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Outbox:
    """What waits on one sending loop, and the drain task sending it, if one runs."""

    def __init__(self) -> None:
        self.pending: dict[tuple[Any, str], list[dict[str, Any]]] = {}
        self.draining: asyncio.Task[None] | None = None


def _enqueue(by_group: dict[tuple[Any, str], list[dict[str, Any]]]) -> None:
    # On the sending loop: merge into what waits, and start a drain unless one is running.
    loop = asyncio.get_running_loop()
    outbox = _outboxes.setdefault(loop, _Outbox())
    for key, items in by_group.items():
        outbox.pending.setdefault(key, []).extend(items)
    if outbox.draining is None or outbox.draining.done():
        outbox.draining = loop.create_task(_drain(outbox))


async def _drain(outbox: _Outbox) -> None:
    while outbox.pending:
        batch = dict(outbox.pending)
        outbox.pending.clear()
        for (layer, group), items in batch.items():
            for start in range(0, len(items), MAX_ITEMS_PER_SEND):
                message = {"type": "ctx.events", "events": items[start : start + MAX_ITEMS_PER_SEND]}
                try:
                    await layer.group_send(group, message)
                except Exception:  # a dashboard push must never fail a committed write
                    logger.warning("live update for %s was not sent", group, exc_info=True)


async def _idle() -> None:
    # On the sending loop: until nothing waits there and no drain runs.
    outbox = _outboxes.get(asyncio.get_running_loop())
    while outbox is not None and outbox.draining is not None and not outbox.draining.done():
        await asyncio.shield(outbox.draining)


def flush_pending(timeout: float = EXIT_FLUSH_SECONDS) -> bool:
    """Wait, at most `timeout` seconds, until this process's background sender has sent what was
    handed to it; False if it had not by then. At exit (atexit) and for tests."""
    sender = _sender
    if sender is None or sender[0] != os.getpid() or not sender[1].is_running():
        return True
    future = asyncio.run_coroutine_threadsafe(_idle(), sender[1])
    try:
        future.result(timeout)
    except TimeoutError:
        future.cancel()
        logger.warning("live updates still pending at exit after %.1f s were not sent", timeout)
        return False
    return True


atexit.register(flush_pending)
