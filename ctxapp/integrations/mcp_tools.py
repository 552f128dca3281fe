"""ctxapp memory as Model Context Protocol tools, on the official `mcp` SDK (MCPServer).

Two transports share one set of tools (`build_server`):

- streamable HTTP at `/mcp` in the ASGI app (ctxapp/integrations/mcp_server.py): the tools call the memory
  services in-process for the tenant of the request's API key;
- stdio (`ctxapp mcp`, `run_stdio` here): the tools call the REST API through
  `ctxapp.client.Client` (`ClientBackend`), with the URL and key from `CTXAPP_URL` / `CTXAPP_API_KEY`.

A tool only shapes arguments and picks the backend of the current call (a context variable set by
the transport); each backend method is one service (or one REST) call, and the backend's `run`
says where the call runs and turns its errors into tool errors. This module needs no Django.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import re
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal, Protocol, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from ctxapp.client import Client, CtxappError

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

    async def run(self, fn: Callable[[Backend], T]) -> T:
        """Call `fn(self)` off the event loop; errors a client can act on become ToolErrors."""
        ...

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


current_backend: contextvars.ContextVar[Backend] = contextvars.ContextVar("ctxapp_mcp_backend")


def fact_key(fact_type: str, content: str) -> str:
    """A stable key for a fact registered without one: the same text registers (updates) one fact."""
    words = re.findall(r"[a-z0-9]+", content.lower())[:6]
    digest = hashlib.sha256(content.strip().encode()).hexdigest()[:8]
    return f"{fact_type}:{'-'.join(words) or 'fact'}-{digest}"[:200]


class ClientBackend:
    """Over the REST API with the Python client (the stdio transport)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def run(self, fn: Callable[[Backend], T]) -> T:
        try:
            return await asyncio.to_thread(fn, self)
        except CtxappError as exc:
            raise ToolError(f"{exc.code}: {exc}") from None

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


async def _call(fn: Callable[[Backend], T]) -> T:
    backend = current_backend.get(None)
    if backend is None:
        raise ToolError("ctxapp: this MCP connection is not authenticated.")
    return await backend.run(fn)


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
    try:
        return version("ctxapp")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


# --- stdio: `ctxapp mcp` ----------------------------------------------------------------------


def run_stdio(*, url: str, api_key: str) -> None:
    """Serve the tools on stdin/stdout, calling the REST API at `url` with `api_key`."""
    server = build_server()
    with Client(url, api_key) as client:
        current_backend.set(ClientBackend(client))
        server.run("stdio")
