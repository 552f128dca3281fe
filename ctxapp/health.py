"""/healthz (the process is up) and /readyz (database, broker and channel layer, each reported)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse

from ctxapp.celery import app
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
        conn.ensure_connection(max_retries=1, timeout=3)
        with conn.channel() as channel:
            declared = channel.queue_declare(queue=settings.CELERY_TASK_DEFAULT_QUEUE, passive=False)
        transport = conn.transport.driver_type
    return {"ok": True, "transport": str(transport), "queued": declared.message_count}


CHANNEL_LAYER_TIMEOUT_SECONDS = 5.0
# One probe channel per layer and process. channels_postgres keeps an advisory lock for every
# channel it has received on, for the life of the process: a new channel per check would leak one
# lock per /readyz call.
_probe_channels: dict[int, str] = {}


async def _channel_layer_roundtrip(layer: Any) -> None:
    channel = _probe_channels.get(id(layer))
    if channel is None:
        channel = _probe_channels[id(layer)] = await layer.new_channel("readyz")
    # channels_postgres drops a message that arrives for a channel before its reader holds the
    # channel's lock, so take the lock before sending (a no-op for other layers).
    take_lock = getattr(layer, "_get_or_create_channel_advisory_lock", None)
    if take_lock is not None:
        await take_lock(channel)
    token = uuid.uuid4().hex
    await layer.send(channel, {"type": "readyz.ping", "token": token})

    async def wait_for_token() -> None:
        # Messages with another token are late answers to earlier probes that timed out: skip them.
        while True:
            message = await layer.receive(channel)
            if message.get("token") == token:
                return

    await asyncio.wait_for(wait_for_token(), CHANNEL_LAYER_TIMEOUT_SECONDS)


def check_channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()
    if layer is None:
        return {"ok": False, "error": "no channel layer configured"}
    try:
        async_to_sync(_channel_layer_roundtrip)(layer)
    except TimeoutError:
        return {"ok": False, "error": f"no message came back within {CHANNEL_LAYER_TIMEOUT_SECONDS:.0f} s"}
    return {"ok": True, "backend": type(layer).__name__}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "broker": check_broker,
    "channel_layer": check_channel_layer,
}


def readyz(request: HttpRequest) -> JsonResponse:
    report: dict[str, Any] = {}
    for name, check in CHECKS.items():
        started = time.perf_counter()
        try:
            result = check()
        except Exception as exc:  # a failed dependency is reported, never raised
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        result["ms"] = round((time.perf_counter() - started) * 1000, 1)
        report[name] = result
    ok = all(part["ok"] for part in report.values())
    # Without a broker the API still accepts every write: the jobs it implies wait in the outbox
    # (memory.services.jobs) and are dispatched once the broker is back. Degraded, not down.
    degraded = not ok and all(part["ok"] for name, part in report.items() if name != "broker")
    if not report["broker"]["ok"]:
        report["broker"]["degraded"] = True
        try:
            report["broker"]["jobs_waiting"] = jobs_waiting()
        except Exception as exc:  # the database check above reports the cause
            logger.debug("jobs_waiting: %s", exc)
    status = "ok" if ok else "degraded" if degraded else "unavailable"
    response = JsonResponse({"status": status, "checks": report}, status=200 if ok or degraded else 503)
    _log_change(ok, report)
    # Load balancers and `ctxapp up` poll this often: log a change of state once (above)
    # instead of an ERROR line from django.request for every 503.
    response._has_been_logged = True  # type: ignore[attr-defined]
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
