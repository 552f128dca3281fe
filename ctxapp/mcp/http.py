"""The MCP server's streamable HTTP transport at `/mcp` in the ASGI app (the tools: tools.py).

Every request passes the same gate as /api/v1 before the SDK sees it: the bearer key's checks
(hashed lookup, scopes, revocation, expiry), the failed-authentication throttle of the client
address, and the per-key and per-address rate limits (memory/api/throttles.py); refusals are the
API's JSON errors (401 `unauthenticated` / `invalid_api_key`, 429 `rate_limited`).

Each tool call is answered in-process by the REST view of its route (`ServiceBackend`): the view's
serializer validates the arguments, its checks (scopes, agent binding, tenant) apply, its errors
are the tool's errors. The rate limits count the MCP request once, at the gate.

A body over `CTXAPP_MAX_BODY_BYTES` (by its Content-Length) is refused with 413, as on /api/v1.
`GET /mcp` (an event stream) is capped per key and in total, and ends after an idle timeout
(`CTXAPP_MCP_STREAM*`). Imported by ctxapp/asgi.py once Django is set up; `ctxapp mcp` (stdio)
does not import it.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlencode

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import HttpResponse
from django.template.response import SimpleTemplateResponse
from django.urls import Resolver404, resolve
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import Tool
from rest_framework import exceptions as drf_exceptions
from rest_framework.request import Request

from ctxapp.api_errors import error_body, exception_handler, handler404, too_large_response
from ctxapp.mcp.bounds import bounds_resolve
from ctxapp.mcp.schema import Call, RestError, ToolSpec
from ctxapp.mcp.tools import build_server, current_backend
from memory.api import throttles
from memory.api.auth import ApiKeyAuthentication
from memory.models import ApiKey

API_PREFIX = "/api/v1"
# Headers of the /mcp request that its tool calls carry to the REST view (who and from where).
FORWARDED_HEADERS = frozenset({b"authorization", b"x-forwarded-for", b"user-agent", b"host"})


class ServiceBackend:
    """In-process: each tool call is the REST view of its route, for the /mcp request's key."""

    def __init__(self, api_key: ApiKey, scope: dict[str, Any]) -> None:
        self.api_key = api_key
        self.scope = scope

    async def scopes(self) -> frozenset[str]:
        return frozenset(self.api_key.effective_scopes)

    async def send(self, call: Call) -> Any:
        response = await sync_to_async(self._view_response, thread_sensitive=False)(call)
        body = json.loads(response.content) if response.content else None
        if response.status_code >= 400:
            error = (body or {}).get("error") or {}
            raise RestError(error.get("code", "error"), error.get("message", ""), error.get("details"))
        return body

    async def tools(self, specs: list[ToolSpec]) -> list[Tool]:
        return [spec.listed(bounds_resolve) for spec in specs]

    def _view_response(self, call: Call) -> HttpResponse:
        """The REST view's answer to `call`, as /api/v1 would give it (without counting it again)."""
        payload = b"" if call.body is None else json.dumps(call.body).encode()
        headers = [
            (name, value) for name, value in self.scope.get("headers", []) if name in FORWARDED_HEADERS
        ]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        path = API_PREFIX + unquote(call.path)  # an ASGI scope's path is decoded, as a server's
        request = ASGIRequest(
            {
                **self.scope,
                "method": call.method,
                "path": path,
                "root_path": "",
                "query_string": urlencode(call.params or {}).encode(),
                "headers": headers,
            },
            io.BytesIO(payload),
        )
        close_old_connections()
        try:
            if "\x00" in request.path_info:  # as UnstorableTextMiddleware: no id holds a NUL
                return handler404(request)
            try:
                match = resolve(request.path_info)
            except Resolver404:
                return handler404(request)
            view_class = match.func.view_class  # type: ignore[attr-defined]
            # The /mcp request was counted by the rate limits at the gate: not again per tool call.
            view = view_class.as_view(throttle_classes=(), **match.func.view_initkwargs)  # type: ignore[attr-defined]
            response: HttpResponse = view(request, *match.args, **match.kwargs)
            if isinstance(response, SimpleTemplateResponse):  # DRF's Response renders lazily
                response.render()
            return response
        finally:
            close_old_connections()


# --- the gate: authentication and rate limits, as on /api/v1 -----------------------------------


def _admit(scope: dict[str, Any]) -> tuple[ApiKey | None, Any]:
    """(the key, None) when this request may pass, else (None, the API's error Response)."""
    request = Request(ASGIRequest(scope, io.BytesIO()))  # headers and address only: no body is read
    close_old_connections()
    try:
        return _authenticated(request), None
    except drf_exceptions.APIException as exc:
        return None, exception_handler(exc, {"view": None})
    finally:
        close_old_connections()


def _authenticated(request: Request) -> ApiKey:
    throttles.auth_failures_defer(request)
    try:
        found = ApiKeyAuthentication().authenticate(request)
        if found is None:
            raise drf_exceptions.NotAuthenticated()
    except (drf_exceptions.NotAuthenticated, drf_exceptions.AuthenticationFailed):
        throttles.auth_failures_settle(request)  # an address over its rate gets 429 first
        throttles.auth_failure_record(request)
        raise
    _, api_key = found
    request.auth = api_key
    limits = [throttles.ApiKeyRateThrottle(), throttles.ClientAddressRateThrottle()]
    exceeded = throttles.throttles_exceeded(request, None, limits)
    if exceeded:
        waits = [wait for throttle in exceeded if (wait := throttle.wait()) is not None]
        raise drf_exceptions.Throttled(wait=max(waits) if waits else None)
    return api_key


def _announced_length(scope: dict[str, Any]) -> int:
    """The request's Content-Length (0 without one)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return 0


async def _send_response(send: Any, response: Any) -> None:
    """An /api/v1 error Response (from the API's exception handler) over raw ASGI."""
    payload = json.dumps(response.data).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers += [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
        if name.lower() != "content-type"  # not rendered yet: its type is not the JSON's
    ]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


# --- GET /mcp event streams: capped, and ended when idle --------------------------------------


class StreamLimits:
    """The open event streams of this process, per key prefix and in total."""

    def __init__(self) -> None:
        self.open: Counter[str] = Counter()

    def refusal(self, prefix: str) -> str | None:
        """Why one more stream of this key is refused, or None."""
        conf = settings.CTXAPP
        if self.open[prefix] >= conf.mcp_streams_per_key:
            return f"This API key has reached its limit of {conf.mcp_streams_per_key} open event streams."
        if sum(self.open.values()) >= conf.mcp_streams_total:
            return f"The server has reached its limit of {conf.mcp_streams_total} open event streams."
        return None


async def _stream_until_idle(
    handle: Callable[[Any, Any], Awaitable[None]], receive: Any, send: Any, idle_seconds: float
) -> None:
    """Run `handle` (an event stream) until it ends or sends no event for `idle_seconds`.

    Idle, the stream is told its client went away (the SDK's stream then stops), and the response
    is finished here, so the client sees the stream end. Keep-alive pings (SSE comments) are not
    events.
    """
    loop = asyncio.get_running_loop()
    last_event = loop.time()
    finished = False

    async def watched_send(message: dict[str, Any]) -> None:
        nonlocal last_event, finished
        body = message.get("body", b"")
        if body and not body.lstrip().startswith(b":"):
            last_event = loop.time()
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            finished = True
        await send(message)

    async def idle_receive() -> dict[str, Any]:
        waiting = asyncio.ensure_future(receive())
        while True:
            left = last_event + idle_seconds - loop.time()
            if left <= 0:
                waiting.cancel()
                return {"type": "http.disconnect"}
            done, _ = await asyncio.wait({waiting}, timeout=left)
            if done:
                return waiting.result()

    await handle(idle_receive, watched_send)
    if not finished:
        await send({"type": "http.response.body", "body": b"", "more_body": False})


# --- streamable HTTP at /mcp ------------------------------------------------------------------


class McpHttpApp:
    """ASGI app for /mcp: the gate, then the SDK's streamable HTTP transport.

    Stateless JSON mode: every POST is self-contained, so any uvicorn worker can answer it. The
    SDK's session manager needs a running task group; it is started on the server's loop by the
    first request (the app also runs under `--lifespan off`).
    """

    def __init__(self) -> None:
        self.server = build_server()
        self.server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            # The bearer key is the protection: a browser page cannot send it cross-origin.
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self.streams = StreamLimits()
        self._started: asyncio.Event | None = None
        self._runner: asyncio.Task[None] | None = None

    async def _ensure_started(self) -> None:
        if self._started is None:
            self._started = asyncio.Event()
            self._runner = asyncio.get_running_loop().create_task(self._run())
        await self._started.wait()

    async def _run(self) -> None:
        assert self._started is not None
        async with self.server.session_manager.run():
            self._started.set()
            await asyncio.Event().wait()  # until the loop ends

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if _announced_length(scope) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:  # as BodySizeLimitMiddleware
            await _send_json(send, 413, json.loads(too_large_response().content))
            return
        api_key, refused = await sync_to_async(_admit, thread_sensitive=False)(scope)
        if api_key is None:
            await _send_response(send, refused)
            return
        await self._ensure_started()
        token = current_backend.set(ServiceBackend(api_key, scope))
        try:
            if scope.get("method") == "GET":
                await self._stream(api_key.prefix, scope, receive, send)
            else:
                await self.server.session_manager.handle_request(scope, receive, send)
        finally:
            current_backend.reset(token)

    async def _stream(self, prefix: str, scope: Any, receive: Any, send: Any) -> None:
        refusal = self.streams.refusal(prefix)
        if refusal is not None:
            await _send_json(send, 429, error_body("rate_limited", refusal))
            return
        self.streams.open[prefix] += 1
        try:
            await _stream_until_idle(
                lambda r, s: self.server.session_manager.handle_request(scope, r, s),
                receive,
                send,
                settings.CTXAPP.mcp_stream_idle_seconds,
            )
        finally:
            self.streams.open[prefix] -= 1


_http_app: McpHttpApp | None = None


def http_app() -> McpHttpApp:
    global _http_app
    if _http_app is None:
        _http_app = McpHttpApp()
    return _http_app
