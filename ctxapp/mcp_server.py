"""ctxapp memory as Model Context Protocol tools, on the official `mcp` SDK (MCPServer).

Two transports share one set of tools:

- streamable HTTP at `/mcp` in the ASGI app (`McpHttpApp`): the bearer API key is checked exactly
  like /api/v1 (hashed lookup, scopes, revocation, expiry; 401 JSON otherwise) and the tools call
  the memory services in-process for the key's tenant (`ServiceBackend`);
- stdio (`ctxapp mcp`): the tools call the REST API through `ctxapp.client.Client`
  (`ClientBackend`), with the URL and key from `CTXAPP_URL` / `CTXAPP_API_KEY`.

A tool only shapes arguments and picks the backend of the current call (a context variable set by
the transport); each backend method is one service (or one REST) call.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar

from asgiref.sync import sync_to_async
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

T = TypeVar("T")

INSTRUCTIONS = (
    "ctxapp is the agent's memory. Start a session with session_start, store each turn with remember, "
    "ask context_build for the next prompt, search earlier turns, summaries, facts and experiences (this "
    "and earlier sessions) with memory_search, record what "
    "worked with experience_record, and end the session with session_end. After a crash, "
    "recovered_state returns everything needed to resume."
)


class Backend(Protocol):
    """What the tools need; one call each. Every method returns JSON-ready data or raises."""

    def search(
        self, *, query: str, scope: dict[str, Any], kinds: list[str] | None, limit: int, neighbours: int
    ) -> dict[str, Any]: ...
    def message_append(self, *, session: str, role: str, content: str) -> dict[str, Any]: ...
    def fact_register(self, *, session: str, key: str, fact_type: str, content: str) -> dict[str, Any]: ...
    def context_build(self, *, session: str, input: str, model: str | None) -> dict[str, Any]: ...
    def session_start(self, *, agent: str, user_id: str | None, model: str | None) -> dict[str, Any]: ...
    def session_end(self, *, session: str) -> dict[str, Any]: ...
    def experience_record(
        self, *, problem: str, solution: str, cause: str, confidence: float, user_id: str | None
    ) -> dict[str, Any]: ...
    def recovered_state(self, *, agent: str) -> dict[str, Any]: ...
    def decay_report(self, *, session: str) -> dict[str, Any]: ...


_backend: contextvars.ContextVar[Backend] = contextvars.ContextVar("ctxapp_mcp_backend")


def fact_key(fact_type: str, content: str) -> str:
    """A stable key for a fact registered without one: the same text registers (updates) one fact."""
    words = re.findall(r"[a-z0-9]+", content.lower())[:6]
    digest = hashlib.sha256(content.strip().encode()).hexdigest()[:8]
    return f"{fact_type}:{'-'.join(words) or 'fact'}-{digest}"[:200]


# --- backends ---------------------------------------------------------------------------------


class ServiceBackend:
    """In-process: the memory services for the tenant of an authenticated API key."""

    def __init__(self, api_key: Any) -> None:
        self.api_key = api_key
        self.tenant = api_key.tenant

    def _require(self, scope: str) -> None:
        from memory.models import ApiKeyScope

        scopes = self.api_key.effective_scopes
        if ApiKeyScope.ADMIN not in scopes and scope not in scopes:
            raise ToolError(f"permission_denied: this API key lacks the '{scope}' scope this tool needs.")

    def _act_as(self, agent: str) -> None:
        """A key bound to an agent acts only as that agent (as on /api/v1)."""
        from memory.exceptions import AgentMismatch

        bound = self.api_key.agent_external_id
        if bound and agent != bound:
            raise AgentMismatch(
                f"This API key is bound to agent {bound!r}; it cannot act as {agent!r}.",
                details={"bound_agent": bound, "requested_agent": agent},
            )

    def _session(self, session: str, *, touch: bool = True) -> Any:
        from memory.selectors.sessions import session_get
        from memory.services.sessions import session_access

        if touch:
            row = session_access(tenant=self.tenant, session_id=session)
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
        from memory.api.message_inputs import message_inputs_validate
        from memory.api.sessions import message_out
        from memory.services.sessions import messages_append

        self._require("write")
        items, _ = message_inputs_validate({"role": role, "content": content})
        messages = messages_append(tenant=self.tenant, session=self._session(session), items=items)
        return message_out(messages[0])

    def fact_register(self, *, session: str, key: str, fact_type: str, content: str) -> dict[str, Any]:
        from memory.api.decay import FactOutputSerializer, _status_of
        from memory.services import decay

        self._require("write")
        row = self._session(session)
        registration = decay.fact_register(
            tenant=self.tenant, session=row, key=key, fact_type=fact_type, content=content
        )
        body = dict(FactOutputSerializer(_status_of(self.tenant, row, registration.fact)).data)
        body["created"] = registration.created
        return body

    def context_build(self, *, session: str, input: str, model: str | None) -> dict[str, Any]:
        from memory.services import context

        self._require("write")
        built = context.context_build(
            tenant=self.tenant, session=self._session(session), next_input=input, model_name=model or ""
        )
        return _json(built.as_dict())

    def session_start(self, *, agent: str, user_id: str | None, model: str | None) -> dict[str, Any]:
        from memory.api.sessions import session_out
        from memory.services.sessions import session_create

        self._require("write")
        self._act_as(agent)
        session = session_create(
            tenant=self.tenant, agent_external_id=agent, user_id=user_id or "", model_name=model or ""
        )
        return session_out(session)

    def session_end(self, *, session: str) -> dict[str, Any]:
        from memory.api.sessions import session_out
        from memory.services import sessions

        self._require("write")
        row = self._session(session, touch=False)
        return session_out(sessions.session_end(tenant=self.tenant, session=row))

    def experience_record(
        self, *, problem: str, solution: str, cause: str, confidence: float, user_id: str | None
    ) -> dict[str, Any]:
        from memory.api.experiences import ExperienceDetailSerializer
        from memory.models import ExtractionMethod
        from memory.services import experiences

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
        from memory.api.shapes import recovered_state_out
        from memory.services import recovery
        from memory.services.sessions import agent_get

        self._require("read")
        self._act_as(agent)
        row = agent_get(tenant=self.tenant, external_id=agent)
        # A bound key is the agent itself: it also gets its private context and inbox, as on /api/v1.
        caller = row if self.api_key.agent_external_id else None
        result = recovery.recovered_state(tenant=self.tenant, agent=row, caller=caller)
        return _json(recovered_state_out(result))

    def decay_report(self, *, session: str) -> dict[str, Any]:
        from memory.api.decay import FactOutputSerializer
        from memory.services import decay

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
    from memory.services import memory_search

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
    return _json(
        {
            "query": result.query,
            "results": [hit.as_dict() for hit in result.results],
            "plan": result.plan,
            "warnings": result.warnings,
            "candidates": result.candidates,
        }
    )


def _json(value: Any) -> Any:
    """Plain JSON types (datetimes, UUIDs, ReturnDicts → str / dict), as the REST API would send."""
    from django.core.serializers.json import DjangoJSONEncoder

    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


class ClientBackend:
    """Over the REST API with the Python client (the stdio transport)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def search(
        self, *, query: str, scope: dict[str, Any], kinds: list[str] | None, limit: int, neighbours: int
    ) -> dict[str, Any]:
        return dict(
            self.client.memory_search(
                query, scope=scope or None, kinds=kinds, limit=limit, neighbours=neighbours or None
            )
        )

    def message_append(self, *, session: str, role: str, content: str) -> dict[str, Any]:
        return dict(self.client.message_append(session, role=role, content=content))

    def fact_register(self, *, session: str, key: str, fact_type: str, content: str) -> dict[str, Any]:
        return self.client.fact_register(session, key=key, type=fact_type, content=content)

    def context_build(self, *, session: str, input: str, model: str | None) -> dict[str, Any]:
        return self.client.context_build(session, input, model=model or None)

    def session_start(self, *, agent: str, user_id: str | None, model: str | None) -> dict[str, Any]:
        return dict(self.client.session_create(agent, user_id=user_id, model=model or None))

    def session_end(self, *, session: str) -> dict[str, Any]:
        return dict(self.client.session_end(session))

    def experience_record(
        self, *, problem: str, solution: str, cause: str, confidence: float, user_id: str | None
    ) -> dict[str, Any]:
        return self.client.experience_create(
            problem, solution=solution, cause=cause, confidence=confidence, user_id=user_id
        )

    def recovered_state(self, *, agent: str) -> dict[str, Any]:
        return self.client.recovered_state(agent)

    def decay_report(self, *, session: str) -> dict[str, Any]:
        return self.client.decay_report(session)


# --- tools ------------------------------------------------------------------------------------


def _run_service(fn: Callable[[Backend], T], backend: Backend) -> T:
    """One backend call in a worker thread: in-process calls run in a transaction (all or nothing)."""
    if isinstance(backend, ServiceBackend):
        from django.db import close_old_connections, transaction

        close_old_connections()
        try:
            with transaction.atomic():
                return fn(backend)
        finally:
            close_old_connections()
    return fn(backend)


async def _call(fn: Callable[[Backend], T]) -> T:
    backend = _backend.get(None)
    if backend is None:
        raise ToolError("ctxapp: this MCP connection is not authenticated.")
    from ctxapp.client import CtxappError
    from memory.exceptions import DomainError

    try:
        if isinstance(backend, ServiceBackend):
            return await sync_to_async(_run_service, thread_sensitive=False)(fn, backend)
        return await asyncio.to_thread(_run_service, fn, backend)
    except DomainError as exc:
        raise ToolError(f"{exc.code}: {exc.message}") from None
    except CtxappError as exc:
        raise ToolError(f"{exc.code}: {exc}") from None


def build_server() -> MCPServer:
    """The MCP server with ctxapp's tools; each call uses the backend its transport set."""
    server: MCPServer = MCPServer("ctxapp", instructions=INSTRUCTIONS, version=_version())

    @server.tool()
    async def memory_search(
        query: str,
        session: str | None = None,
        sessions: Literal["all", "current"] = "all",
        agent: str | None = None,
        user_id: str | None = None,
        kinds: list[Literal["message", "summary", "fact", "experience"]] | None = None,
        limit: int = 10,
        neighbours: int = 0,
    ) -> dict[str, Any]:
        """Search the agent's memory by meaning and keywords: earlier conversation turns (also from past
        sessions), session summaries, tracked facts and stored experiences.

        Scope: `session` with sessions="all" (default) searches every session of that session's user
        (or agent, when it has no user), sessions="current" only that session; `agent` and `user_id`
        narrow to that agent's / user's sessions; nothing searches the whole tenant. `kinds` picks any
        of message, summary, fact, experience (default all); `limit` is 1 to 100; `neighbours` (0 to
        5) adds that many turns either side of each message hit.
        Returns `results`, best first: kind, id, session, seq, occurred_at, speaker, text, score and
        each signal's contribution.
        """
        if not query.strip():
            raise ToolError("validation_error: query must not be empty.")
        if not 1 <= limit <= 100:
            raise ToolError("validation_error: limit must be between 1 and 100.")
        if not 0 <= neighbours <= 5:
            raise ToolError("validation_error: neighbours must be between 0 and 5.")
        if sessions == "current" and not session:
            raise ToolError("validation_error: sessions='current' needs a session.")
        scope: dict[str, Any] = {
            k: v for k, v in {"agent": agent, "user_id": user_id, "session": session}.items() if v is not None
        }
        if session:
            scope["sessions"] = sessions
        chosen: list[str] | None = [str(k) for k in kinds] if kinds else None
        return await _call(
            lambda b: b.search(query=query, scope=scope, kinds=chosen, limit=limit, neighbours=neighbours)
        )

    @server.tool()
    async def remember(
        session: str,
        content: str,
        kind: Literal["message", "fact"] = "message",
        role: Literal["user", "assistant", "system", "tool"] = "user",
        fact_type: str = "constraint",
        key: str | None = None,
    ) -> dict[str, Any]:
        """Store something in a session: a conversation turn (kind="message", with its role), or a fact
        to keep in view (kind="fact": fact_type such as constraint, decision, goal, preference; the
        optional key identifies it, so registering the same key again updates it).

        Returns the stored message (with its seq) or the tracked fact.
        """
        if kind == "fact":
            fact = key or fact_key(fact_type, content)
            return await _call(
                lambda b: b.fact_register(session=session, key=fact, fact_type=fact_type, content=content)
            )
        return await _call(lambda b: b.message_append(session=session, role=role, content=content))

    @server.tool()
    async def context_build(session: str, input: str = "", model: str | None = None) -> dict[str, Any]:
        """Build the next prompt for a session within the model's token budget.

        `input` is the upcoming user message. Returns `messages` (ready for the model), the `manifest`
        (what was included and why), the `budget` (tokens, utilisation) and `warnings`.
        """
        return await _call(lambda b: b.context_build(session=session, input=input, model=model))

    @server.tool()
    async def session_start(
        agent: str, user_id: str | None = None, model: str | None = None
    ) -> dict[str, Any]:
        """Open a new session for an agent (created on first use), optionally for a user and a model.

        Returns the session; pass its `id` to remember, context_build, decay_report and session_end.
        """
        return await _call(lambda b: b.session_start(agent=agent, user_id=user_id, model=model))

    @server.tool()
    async def session_end(session: str) -> dict[str, Any]:
        """End a session: its important facts are promoted to long-term memory. Ending twice is harmless."""
        return await _call(lambda b: b.session_end(session=session))

    @server.tool()
    async def experience_record(
        problem: str,
        solution: str = "",
        cause: str = "",
        confidence: float = 0.5,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        """Record a lesson in long-term memory: a problem, its cause and the solution that worked.

        `confidence` is 0 to 1. An exact duplicate merges into the existing experience (`outcome`).
        """
        if not problem.strip():
            raise ToolError("validation_error: problem must not be empty.")
        if not 0.0 <= confidence <= 1.0:
            raise ToolError("validation_error: confidence must be between 0 and 1.")
        return await _call(
            lambda b: b.experience_record(
                problem=problem, solution=solution, cause=cause, confidence=confidence, user_id=user_id
            )
        )

    @server.tool()
    async def recovered_state(agent: str) -> dict[str, Any]:
        """Everything an agent needs to resume after a crash: the fold of its events, its latest
        checkpoint and current state, its latest session with recent messages, and its open tasks."""
        return await _call(lambda b: b.recovered_state(agent=agent))

    @server.tool()
    async def decay_report(session: str) -> dict[str, Any]:
        """The session's tracked facts that have decayed (not referenced for too many rounds), most
        urgent first, each with a recommendation (restate_now, consider_restating, no_action)."""
        return await _call(lambda b: b.decay_report(session=session))

    return server


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ctxapp")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


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
        token = _backend.set(ServiceBackend(api_key))
        try:
            await self.server.session_manager.handle_request(scope, receive, send)
        finally:
            _backend.reset(token)


def _authenticate(scope: Any) -> tuple[Any, str]:
    """(ApiKey, "") for a usable bearer key, else (None, why) — the same checks as /api/v1."""
    from django.db import close_old_connections
    from rest_framework.exceptions import AuthenticationFailed

    from memory.api.auth import api_key_authenticate

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


# --- stdio: `ctxapp mcp` ----------------------------------------------------------------------


def run_stdio(*, url: str, api_key: str) -> None:
    """Serve the tools on stdin/stdout, calling the REST API at `url` with `api_key`."""
    from ctxapp.client import Client

    server = build_server()
    with Client(url, api_key) as client:
        _backend.set(ClientBackend(client))
        server.run("stdio")
