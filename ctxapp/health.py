"""/healthz (the process is up) and /readyz (database, broker and channel layer, each reported)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    if row is None:
        return {"ok": False, "error": "the vector extension is not installed"}
    return {"ok": True, "pgvector": row[0], "server": connection.pg_version}


def check_broker() -> dict[str, Any]:
    from ctxapp.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=3)
        transport = conn.transport_cls if isinstance(conn.transport_cls, str) else conn.transport.driver_type
    return {"ok": True, "transport": str(transport)}


def check_channel_layer() -> dict[str, Any]:
    layer = get_channel_layer()
    if layer is None:
        return {"ok": False, "error": "no channel layer configured"}
    channel = async_to_sync(layer.new_channel)()
    token = uuid.uuid4().hex
    async_to_sync(layer.send)(channel, {"type": "readyz.ping", "token": token})
    received = async_to_sync(layer.receive)(channel)
    if received.get("token") != token:
        return {"ok": False, "error": "the channel layer returned another message"}
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
    return JsonResponse({"status": "ok" if ok else "unavailable", "checks": report}, status=200 if ok else 503)
