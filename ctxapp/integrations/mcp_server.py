"""The MCP server's streamable HTTP transport at `/mcp` in the ASGI app (the tools: mcp_tools.py).

The bearer API key is checked exactly like /api/v1 (hashed lookup, scopes, revocation, expiry;
401 JSON otherwise), and the tools call the memory services in-process for the key's tenant
(`ServiceBackend`), each call in its own transaction. Imported by ctxapp/asgi.py once Django is
set up; `ctxapp mcp` (stdio) does not import it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections, transaction
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from rest_framework.exceptions import AuthenticationFailed

from ctxapp.integrations.mcp_tools import Backend, build_server, current_backend
from memory.api.auth import api_key_authenticate
from memory.api.context_shapes import built_context_out
from memory.api.decay import FactOutputSerializer, _status_of
from memory.api.experiences import ExperienceDetailSerializer
from memory.api.memory import search_result_out
from memory.api.message_inputs import message_inputs_validate
from memory.api.shapes import message_out, recovered_state_out, session_out
from memory.exceptions import AgentMismatch, DomainError
from memory.models import ApiKeyScope, ExtractionMethod
from memory.selectors.sessions import session_get
from memory.services import context, decay, experiences, memory_search, recovery, sessions

T = TypeVar("T")


class ServiceBackend:
    """In-process: the memory services for the tenant of an authenticated API key."""

    def __init__(self, api_key: Any) -> None:
        self.api_key = api_key
        self.tenant = api_key.tenant

    async def run(self, fn: Callable[[Backend], T]) -> T:
        try:
            return await sync_to_async(self._in_transaction, thread_sensitive=False)(fn)
        except DomainError as exc:
            raise ToolError(f"{exc.code}: {exc.message}") from None

    def _in_transaction(self, fn: Callable[[Backend], T]) -> T:
        """One backend call in a worker thread, in a transaction (all or nothing)."""
        close_old_connections()
        try:
            with transaction.atomic():
                return fn(self)
        finally:
            close_old_connections()

    def _require(self, scope: str) -> None:
        scopes = self.api_key.effective_scopes
        if ApiKeyScope.ADMIN not in scopes and scope not in scopes:
            raise ToolError(f"permission_denied: this API key lacks the '{scope}' scope this tool needs.")

    def _act_as(self, agent: str) -> None:
        """A key bound to an agent acts only as that agent (as on /api/v1)."""
        bound = self.api_key.agent_external_id
        if bound and agent != bound:
            raise AgentMismatch(
                f"This API key is bound to agent {bound!r}; it cannot act as {agent!r}.",
                details={"bound_agent": bound, "requested_agent": agent},
            )

    def _session(self, session: str, *, touch: bool = True) -> Any:
        if touch:
            row = sessions.session_access(tenant=self.tenant, session_id=session)
        else:
            row = session_get(tenant=self.tenant, session_id=session)
        if self.api_key.agent_external_id:
            self._act_as(row.agent.external_id)
        return row

    def search(
        self, *, query: str, scope: dict[str, Any], kinds: list[str] | None, limit: int, neighbours: int
    ) -> dict[str, Any]:
        self._require("read")
        bound = self.api_key.agent_external_id
        if bound:  # a key bound to an agent searches only that agent's memory (as on /api/v1)
            self._act_as(scope.get("agent") or bound)
            if scope.get("session"):  # nor another agent's session (even with sessions="current")
                self._session(scope["session"], touch=False)
            scope = {**scope, "agent": bound}
        return _search(
            tenant=self.tenant, query=query, scope=scope, kinds=kinds, limit=limit, neighbours=neighbours
        )

    def message_append(self, *, session: str, role: str, content: str) -> dict[str, Any]:
        self._require("write")
        items, _ = message_inputs_validate({"role": role, "content": content})
        messages = sessions.messages_append(tenant=self.tenant, session=self._session(session), items=items)
        return message_out(messages[0])

    def fact_register(self, *, session: str, key: str, fact_type: str, content: str) -> dict[str, Any]:
        self._require("write")
        row = self._session(session)
        registration = decay.fact_register(
            tenant=self.tenant, session=row, key=key, fact_type=fact_type, content=content
        )
        body = dict(FactOutputSerializer(_status_of(self.tenant, row, registration.fact)).data)
        body["created"] = registration.created
        return body

    def context_build(self, *, session: str, input: str, model: str | None) -> dict[str, Any]:
        self._require("write")
        built = context.context_build(
            tenant=self.tenant, session=self._session(session), next_input=input, model_name=model or ""
        )
        return _json(built_context_out(built))

    def session_start(self, *, agent: str, user_id: str | None, model: str | None) -> dict[str, Any]:
        self._require("write")
        self._act_as(agent)
        session = sessions.session_create(
            tenant=self.tenant, agent_external_id=agent, user_id=user_id or "", model_name=model or ""
        )
        return session_out(session)

    def session_end(self, *, session: str) -> dict[str, Any]:
        self._require("write")
        row = self._session(session, touch=False)
        return session_out(sessions.session_end(tenant=self.tenant, session=row))

    def experience_record(
        self, *, problem: str, solution: str, cause: str, confidence: float, user_id: str | None
    ) -> dict[str, Any]:
        self._require("write")
        result = experiences.experience_create(
            tenant=self.tenant,
            problem=problem,
            solution=solution,
            cause=cause,
            confidence=confidence,
            user_id=user_id or "",
            extraction_method=ExtractionMethod.MANUAL,
        )
        body = dict(ExperienceDetailSerializer(result.experience).data)
        body["outcome"] = result.outcome
        return _json(body)

    def recovered_state(self, *, agent: str) -> dict[str, Any]:
        self._require("read")
        self._act_as(agent)
        row = sessions.agent_get(tenant=self.tenant, external_id=agent)
        # A bound key is the agent itself: it also gets its private context and inbox, as on /api/v1.
        caller = row if self.api_key.agent_external_id else None
        result = recovery.recovered_state(tenant=self.tenant, agent=row, caller=caller)
        return _json(recovered_state_out(result))

    def decay_report(self, *, session: str) -> dict[str, Any]:
        self._require("read")
        row = self._session(session)
        current, statuses = decay.facts_list(tenant=self.tenant, session=row, decayed=True)
        return {
            "session": row.public_id,
            "round": current,
            "items": [dict(FactOutputSerializer(status).data) for status in statuses],
        }


def _search(
    *, tenant: Any, query: str, scope: dict[str, Any], kinds: list[str] | None, limit: int, neighbours: int
) -> dict[str, Any]:
    """Memory search for the HTTP transport: the service behind POST /api/v1/memory/search, same body."""
    result = memory_search.memory_search(
        tenant=tenant,
        query=query,
        scope=memory_search.SearchScope(
            agent=scope.get("agent") or None,
            user_id=scope.get("user_id"),
            session=scope.get("session") or None,
            sessions=scope.get("sessions", "all"),
        ),
        kinds=kinds,
        limit=limit,
        neighbours=neighbours,
    )
    return _json(search_result_out(result))


def _json(value: Any) -> Any:
    """Plain JSON types (datetimes, UUIDs, ReturnDicts → str / dict), as the REST API would send."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


# --- streamable HTTP at /mcp ------------------------------------------------------------------


class McpHttpApp:
    """ASGI app for /mcp: bearer-key authentication, then the SDK's streamable HTTP transport.

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
        api_key, problem = await sync_to_async(_authenticate, thread_sensitive=False)(scope)
        if api_key is None:
            await _send_json(send, 401, {"error": {"code": "not_authenticated", "message": problem}})
            return
        await self._ensure_started()
        token = current_backend.set(ServiceBackend(api_key))
        try:
            await self.server.session_manager.handle_request(scope, receive, send)
        finally:
            current_backend.reset(token)


def _authenticate(scope: Any) -> tuple[Any, str]:
    """(ApiKey, "") for a usable bearer key, else (None, why) — the same checks as /api/v1."""
    header = ""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            header = value.decode("latin-1")
    scheme, _, raw = header.partition(" ")
    if not header:
        return None, "Authentication credentials were not provided: send 'Authorization: Bearer <api key>'."
    if scheme.lower() != "bearer" or not raw.strip():
        return None, "Malformed Authorization header: expected 'Authorization: Bearer <api key>'."
    close_old_connections()
    try:
        return api_key_authenticate(raw.strip()), ""
    except AuthenticationFailed as exc:
        return None, str(exc.detail)
    finally:
        close_old_connections()


async def _send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    if "details" not in body.get("error", {"details": None}):
        body["error"]["details"] = {}
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"www-authenticate", b'Bearer realm="api"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


_http_app: McpHttpApp | None = None


def http_app() -> McpHttpApp:
    global _http_app
    if _http_app is None:
        _http_app = McpHttpApp()
    return _http_app
