"""/healthz (the process is up) and /readyz (database, broker, channel layer and, with
DATABASE_REPLICA_URL, the read replica's lag; each reported)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

# Imported here, once: the checks below run in threads, and a first import of redis-py in two
# threads at once (the cache's in one, the channel layer's in another) fails on a half-initialised module.
import redis.exceptions
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, connections
from django.http import HttpRequest, JsonResponse

from ctxapp.celery import app
from memory import replica
from memory.services.job_health import jobs_health
from memory.services.jobs import jobs_waiting

logger = logging.getLogger(__name__)


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    if row is None:
        return {"ok": False, "error": "the vector extension is not installed"}
    return {"ok": True, "pgvector": row[0], "server": getattr(connection, "pg_version", None)}


def check_broker() -> dict[str, Any]:
    """Connect to the broker and declare the default queue (a real round trip, for every transport)."""
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=0, timeout=CHECK_TIMEOUT_SECONDS)
        with conn.channel() as channel:
            declared = channel.queue_declare(queue=settings.CELERY_TASK_DEFAULT_QUEUE, passive=False)
        transport = conn.transport.driver_type
    return {"ok": True, "transport": str(transport), "queued": declared.message_count}


CHANNEL_LAYER_TIMEOUT_SECONDS = 1.2


async def _channel_layer_roundtrip(layer: Any) -> None:
    # A channel of its own for each probe, and a plain one (no "!"): channels_redis reads every
    # process-local channel ("name!…") through one shared receiver, and a probe cancelled at its
    # deadline left that receiver stuck, failing every later check (the soak drill saw it).
    channel = f"readyz.{uuid.uuid4().hex}"
    await layer.send(channel, {"type": "readyz.ping"})
    await layer.receive(channel)


async def _channel_layer_probe(layer: Any) -> None:
    try:
        await _channel_layer_roundtrip(layer)
    except redis.exceptions.ConnectionError:
        # Once more, on a fresh connection: a pooled one can be found closed by the server on its
        # first use long after the server came back (the soak drill's Redis-killed run saw one
        # 503, 50 s after the restart, with every request answered). A server that is down
        # refuses this connection too, so the answer stays true.
        await _channel_layer_roundtrip(layer)


def check_channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()
    if layer is None:
        return {"ok": False, "error": "no channel layer configured"}
    try:
        # The whole round trip is bounded, the send too: a layer whose server is down can wait in
        # its connect.
        async_to_sync(asyncio.wait_for)(_channel_layer_probe(layer), CHANNEL_LAYER_TIMEOUT_SECONDS)
    except TimeoutError:
        return {"ok": False, "error": f"no message came back within {CHANNEL_LAYER_TIMEOUT_SECONDS:.0f} s"}
    return {"ok": True, "backend": type(layer).__name__}


def check_replica() -> dict[str, Any]:
    """The replica's lag, measured now; also what the read routing goes by (memory/replica.py)."""
    return replica.replica_health(fresh=True).report()


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "broker": check_broker,
    "channel_layer": check_channel_layer,
    "jobs": jobs_health,
}
if replica.replica_configured():
    CHECKS["replica"] = check_replica
# Every check gets this long, all at once: /readyz answers within about this time even while a
# dependency hangs (a stopping PostgreSQL accepts connections it never answers), so a probe with
# a 2 s timeout gets an answer on a busy machine too.
CHECK_TIMEOUT_SECONDS = 1.4
# Parts that may fail with the API still taking writes: without a broker the jobs a write implies
# wait in the outbox (memory.services.jobs) and are dispatched once it is back; a stalled worker
# delays them the same way. Degraded, not down.
# A replica behind or down: its reads go to the primary, slower but complete.
DEGRADABLE = {"broker", "jobs", "replica"}


def _run_check_inline(check: Callable[[], dict[str, Any]], into: dict[str, Any]) -> None:
    started = time.perf_counter()
    try:
        result = check()
    except Exception as exc:  # a failed dependency is reported, never raised
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result["ms"] = round((time.perf_counter() - started) * 1000, 1)
    into.update(result)


def _run_check(check: Callable[[], dict[str, Any]], into: dict[str, Any]) -> None:
    try:
        _run_check_inline(check, into)
    finally:
        connections.close_all()  # this thread's own; it ends here


# Runs in the request's own thread: a channel layer is bound to the event loop it was first used
# on (the server's, reached through async_to_sync), and it bounds its own wait.
INLINE = "channel_layer"


def _run_checks() -> dict[str, Any]:
    """Run every check but INLINE in its own thread; one that has not answered by the deadline is
    reported as such and left to finish on its own (a daemon thread never holds the process up)."""
    results: dict[str, dict[str, Any]] = {name: {} for name in CHECKS}
    threads = {
        name: threading.Thread(
            target=_run_check, args=(check, results[name]), daemon=True, name=f"readyz-{name}"
        )
        for name, check in CHECKS.items()
        if name != INLINE
    }
    for thread in threads.values():
        thread.start()
    deadline = time.monotonic() + CHECK_TIMEOUT_SECONDS
    _run_check_inline(CHECKS[INLINE], results[INLINE])
    for name, thread in threads.items():
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() or not results[name]:
            results[name] = {"ok": False, "error": f"no answer within {CHECK_TIMEOUT_SECONDS} s"}
    return {name: dict(results[name]) for name in CHECKS}


def readyz(request: HttpRequest) -> JsonResponse:
    report = _run_checks()
    ok = all(part["ok"] for part in report.values())
    degraded = not ok and all(part["ok"] for name, part in report.items() if name not in DEGRADABLE)
    if not report["broker"]["ok"]:
        report["broker"]["degraded"] = True
        if report["database"]["ok"]:
            try:
                report["broker"]["jobs_waiting"] = jobs_waiting()
            except Exception as exc:  # the database check above reports the cause
                logger.debug("jobs_waiting: %s", exc)
    status = "ok" if ok else "degraded" if degraded else "unavailable"
    response = JsonResponse({"status": status, "checks": report}, status=200 if ok or degraded else 503)
    _log_change(ok, report)
    return response


_last_state: dict[str, bool | None] = {"ok": None}


def _log_change(ok: bool, report: dict[str, Any]) -> None:
    if _last_state["ok"] is ok:
        return
    previous, _last_state["ok"] = _last_state["ok"], ok
    if ok and previous is not None:
        logger.warning("readyz: every dependency is ok again")
    elif not ok:
        failing = {name: part.get("error") for name, part in report.items() if not part["ok"]}
        logger.warning("readyz: not ready: %s", failing)
