"""ctxapp memory as Model Context Protocol tools, on the official `mcp` SDK (MCPServer).

Two transports share one set of tools (`build_server`):

- streamable HTTP at `/mcp` in the ASGI app (ctxapp/integrations/mcp_server.py): each tool call is
  answered in-process by the REST view of its route, for the request's API key;
- stdio (`ctxapp mcp`, `run_stdio` here): each tool call is one REST request through
  `ctxapp.client.Client` (`ClientBackend`), with the URL and key from `CTXAPP_URL` / `CTXAPP_API_KEY`.

A tool only turns its arguments into one REST request (method, path, body or query); the REST
view's input serializer validates them, so a tool accepts exactly what the API accepts and
refuses the rest with the API's own `code: message`, over both transports alike. The arguments
are therefore not validated by the SDK (pydantic): the schemas listed to the client describe them
(types, bounds, descriptions) and the API enforces them. This module needs no Django.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol
from urllib.parse import quote

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from ctxapp.client import Client, CtxappError
from ctxapp.client._core import Request, operation

INSTRUCTIONS = (
    "ctxapp is the agent's memory. Start a session with session_start, store each turn with remember, "
    "ask context_build for the next prompt, search earlier turns, summaries, facts and experiences (this "
    "and earlier sessions) with memory_search, keep what you learn about the user with remember "
    '(kind="user_memory") and read or correct it with memory_list and memory_update, record what '
    "worked with experience_record, and end the session with session_end. After a crash, "
    "recovered_state returns everything needed to resume."
)

# The bounds of the REST input serializers (tests/test_mcp.py holds them equal).
SEARCH_MAX_LIMIT = 100
SEARCH_MAX_NEIGHBOURS = 5
QUERY_MAX_LENGTH = 4000
FACTS_MAX_LIMIT = 1000
NAME_MAX_LENGTH = 200


@dataclass(frozen=True)
class Call:
    """One REST request under /api/v1: what a tool call becomes."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


class Backend(Protocol):
    """Where a tool's REST request is answered. Errors come back as ToolError('code: message')."""

    async def send(self, call: Call) -> Any: ...

    async def scopes(self) -> frozenset[str]:
        """The scopes of the caller's API key (`read`, `write`, `admin`)."""
        ...


current_backend: contextvars.ContextVar[Backend] = contextvars.ContextVar("ctxapp_mcp_backend")


def fact_key(fact_type: str, content: str) -> str:
    """A stable key for a fact registered without one: the same text registers (updates) one fact."""
    words = re.findall(r"[a-z0-9]+", content.lower())[:6]
    digest = hashlib.sha256(content.strip().encode()).hexdigest()[:8]
    return f"{fact_type}:{'-'.join(words) or 'fact'}-{digest}"[:200]


def tool_error(code: str, message: str) -> ToolError:
    return ToolError(f"{code}: {message}")


# --- the tools: JSON schema, annotations, and the REST request each call becomes ---------------


def _string(
    description: str, *, max_length: int | None = None, enum: Sequence[str] = (), default: str | None = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": description}
    if default is not None:
        schema["default"] = default
    if max_length is not None:
        schema["maxLength"] = max_length
    if enum:
        schema["enum"] = list(enum)
    return schema


def _integer(description: str, *, minimum: int, maximum: int, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": description, "minimum": minimum}
    schema["maximum"] = maximum
    if default is not None:
        schema["default"] = default
    return schema


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    properties: dict[str, dict[str, Any]]
    request: Callable[[dict[str, Any]], Call]
    scope: str  # the API key scope its REST route needs: `read` tools change nothing
    path_arguments: tuple[str, ...] = ()  # parts of the route's URL (required)
    required: tuple[str, ...] = ()  # required body fields
    idempotent: bool = True  # the same call again changes nothing more
    # Erases what cannot be had back (memory_forget). Others only add: sessions end, facts update by
    # key, and a corrected user memory keeps its old version in the history.
    destructive: bool = False

    @property
    def annotations(self) -> ToolAnnotations:
        return ToolAnnotations(
            read_only_hint=self.scope == "read",
            destructive_hint=self.destructive,
            idempotent_hint=self.idempotent,
            open_world_hint=False,
        )

    def listed(self) -> Tool:
        schema: dict[str, Any] = {"type": "object", "properties": self.properties}
        schema |= {"required": [*self.path_arguments, *self.required], "additionalProperties": False}
        return Tool(
            name=self.name,
            description=self.description,
            input_schema=schema,
            output_schema={"type": "object"},
            annotations=self.annotations,
        )

    def call(self, arguments: dict[str, Any]) -> Call:
        """The REST request for these arguments; only the URL's own parts are checked here."""
        unknown = sorted(set(arguments) - set(self.properties))
        if unknown:
            raise tool_error(
                "validation_error",
                f"{unknown[0]}: Unknown field. Known: {', '.join(sorted(self.properties))}.",
            )
        for name in self.path_arguments:
            value = arguments.get(name)
            if value is None:
                raise tool_error("validation_error", f"{name}: This field is required.")
            if not isinstance(value, str) or not value:
                raise tool_error("validation_error", f"{name}: Must be a non-empty string.")
        return self.request(arguments)


def _given(
    arguments: dict[str, Any], names: Sequence[str], rename: dict[str, str] | None = None
) -> dict[str, Any]:
    """The body fields among `arguments` (as given: the REST serializer judges them)."""
    rename = rename or {}
    return {rename.get(name, name): arguments[name] for name in names if name in arguments}


def _segment(value: str) -> str:
    return quote(value, safe="")


def _search(arguments: dict[str, Any]) -> Call:
    body = _given(arguments, ("query", "kinds", "limit", "neighbours"))
    scope = _given(arguments, ("agent", "user_id", "session", "sessions"))
    if scope:
        body["scope"] = scope
    return Call("POST", "/memory/search", body=body)


def _required_string(arguments: dict[str, Any], name: str, why: str = "") -> str:
    value = arguments.get(name)
    if value is None:
        raise tool_error("validation_error", f"{name}: This field is required{why}.")
    if not isinstance(value, str) or not value:
        raise tool_error("validation_error", f"{name}: Must be a non-empty string.")
    return value


def _user_memories(arguments: dict[str, Any], memory: str | None = None) -> str:
    path = f"/users/{_segment(_required_string(arguments, 'user_id'))}/memories"
    return path if memory is None else f"{path}/{_segment(memory)}"


def _remember(arguments: dict[str, Any]) -> Call:
    kind = arguments.get("kind", "message")
    if kind == "user_memory":
        for name in ("session", "fact_type", "key"):
            if name in arguments:
                raise tool_error(
                    "validation_error", f"{name}: Not with kind=user_memory (it outlives sessions)."
                )
        _required_string(arguments, "subject", " (kind=user_memory)")
        names = ("subject", "content", "memory_type")
        body = _given(arguments, names, {"content": "text", "memory_type": "type"})
        return Call("POST", _user_memories(arguments), body=body)
    session = _segment(_required_string(arguments, "session"))
    if kind == "message":
        body = {"role": "user", **_given(arguments, ("role", "content"))}
        return Call("POST", f"/sessions/{session}/messages", body=body)
    if kind != "fact":
        raise tool_error("validation_error", f'kind: "{kind}" is not a valid choice.')
    for name in ("user_id", "subject", "memory_type"):
        if name in arguments:
            raise tool_error("validation_error", f"{name}: Only with kind=user_memory.")
    body = _given(arguments, ("key", "content", "fact_type"), {"fact_type": "type"})
    body.setdefault("type", "constraint")
    if "key" not in body and isinstance(body.get("content"), str) and isinstance(body["type"], str):
        body["key"] = fact_key(body["type"], body["content"])
    return Call("POST", f"/sessions/{session}/facts", body=body)


def _memory_list(arguments: dict[str, Any]) -> Call:
    params = _given(arguments, ("as_of", "type", "cursor", "limit"))
    return Call("GET", _user_memories(arguments), params=params)


def _memory_update(arguments: dict[str, Any]) -> Call:
    body = _given(arguments, ("text", "type", "confidence"))
    return Call("PATCH", _user_memories(arguments, arguments["memory"]), body=body)


def _memory_forget(arguments: dict[str, Any]) -> Call:
    return Call("DELETE", _user_memories(arguments, arguments["memory"]))


def _decay_report(arguments: dict[str, Any]) -> Call:
    params = {"decayed": "true", **_given(arguments, ("cursor", "limit"))}
    return Call("GET", f"/sessions/{_segment(arguments['session'])}/facts", params=params)


SESSION_ARG = _string("The session id (`sess_…`) from session_start.")
USER_ARG = _string("The user's id (the `user_id` of their sessions).", max_length=NAME_MAX_LENGTH)
MEMORY_ARG = _string("The user memory's id (`umem_…`), from memory_list.")
MEMORY_TYPES = ("profile", "preference", "decision", "constraint", "plan", "fact")
USER_MEMORY_TEXT_MAX_LENGTH = 4000  # memory/services/user_memory/store.py MAX_TEXT_CHARS
AGENT_ARG = _string("The agent's external id (your name for it).")

ID_ARGUMENTS = {"session": SESSION_ARG, "agent": AGENT_ARG}


def _by_id(name: str, description: str, route: tuple[str, str, str], *, scope: str) -> ToolSpec:
    """A tool whose one argument is the id in its route (`route`: method, path template, argument)."""
    method, template, argument = route
    return ToolSpec(
        name=name,
        description=description,
        properties={argument: ID_ARGUMENTS[argument]},
        scope=scope,
        request=lambda a: Call(method, template.format(_segment(a[argument]))),
        path_arguments=(argument,),
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="memory_search",
        description=(
            "Search the agent's memory by meaning and keywords: earlier conversation turns (also from "
            "past sessions), session summaries, tracked facts and stored experiences. Scope: `session` "
            'with sessions="all" (default) searches every session of that session\'s user (or agent, when '
            'it has no user), sessions="current" only that session; `agent` and `user_id` narrow to that '
            "agent's / user's sessions; without any of them the whole tenant is searched. Returns "
            "`results`, best first: kind, id, session, seq, occurred_at, speaker, text, score and each "
            "signal's contribution."
        ),
        properties={
            "query": _string("What to look for (non-empty).", max_length=QUERY_MAX_LENGTH),
            "session": _string("Search around this session (see `sessions`)."),
            "sessions": _string(
                "`all`: every session of the session's user (or agent); `current`: only `session`.",
                enum=("all", "current"),
                default="all",
            ),
            "agent": _string("Only this agent's sessions."),
            "user_id": _string("Only this user's sessions."),
            "kinds": {
                "type": "array",
                "items": {"type": "string", "enum": ["message", "summary", "fact", "experience"]},
                "minItems": 1,
                "description": "Which kinds of memory to search (default: all four).",
            },
            "limit": _integer("How many results at most.", minimum=1, maximum=SEARCH_MAX_LIMIT, default=10),
            "neighbours": _integer(
                "Turns to include either side of each message hit.",
                minimum=0,
                maximum=SEARCH_MAX_NEIGHBOURS,
                default=0,
            ),
        },
        required=("query",),
        scope="read",
        request=_search,
    ),
    ToolSpec(
        name="remember",
        description=(
            'Store something: a conversation turn of a session (kind="message", with its role), a fact '
            'to keep in view in that session (kind="fact", with its fact_type; the optional key '
            "identifies it, so registering the same key again updates it), or a durable memory about "
            'the user that outlives sessions (kind="user_memory", with user_id and subject: a new '
            "value for the same subject supersedes the old one, see memory_list). Returns the stored "
            "message (with its seq), the tracked fact, or the user memory."
        ),
        properties={
            "session": _string("The session id (`sess_…`) from session_start; not for kind=user_memory."),
            "content": _string("The message text, the fact's text, or the memory about the user."),
            "kind": _string(
                "`message`: a conversation turn; `fact`: a fact to keep in view in the session; "
                "`user_memory`: a memory about the user across sessions.",
                enum=("message", "fact", "user_memory"),
                default="message",
            ),
            "role": _string(
                "Who said it (kind=message).", enum=("user", "assistant", "system", "tool"), default="user"
            ),
            "fact_type": _string(
                "The fact's type (kind=fact), lowercase: constraint, decision, goal, preference, …",
                max_length=64,
                default="constraint",
            ),
            "key": _string(
                "The fact's key (kind=fact); default: derived from its type and text.",
                max_length=NAME_MAX_LENGTH,
            ),
            "user_id": USER_ARG | {"description": "The user the memory is about (kind=user_memory)."},
            "subject": _string(
                "What the memory is about, e.g. `home.city` (kind=user_memory); a new value replaces it.",
                max_length=NAME_MAX_LENGTH,
            ),
            "memory_type": _string(
                "The user memory's type (kind=user_memory).", enum=MEMORY_TYPES, default="fact"
            ),
        },
        required=("content",),
        scope="write",
        idempotent=False,
        request=_remember,
    ),
    ToolSpec(
        name="context_build",
        description=(
            "Build the next prompt for a session within the model's token budget. Returns `messages` "
            "(ready for the model), the `manifest` (what was included and why), the `budget` (tokens, "
            "utilisation) and `warnings`."
        ),
        properties={
            "session": SESSION_ARG,
            "input": _string("The upcoming user message (what the prompt is for)."),
            "model": _string("The model the prompt is for (its budget); default: the session's model."),
        },
        scope="write",
        idempotent=False,
        request=lambda a: Call(
            "POST", f"/sessions/{_segment(a['session'])}/context", body=_given(a, ("input", "model"))
        ),
        path_arguments=("session",),
    ),
    ToolSpec(
        name="session_start",
        description=(
            "Open a new session for an agent (created on first use), optionally for a user and a model. "
            "With a `key` (your own id for the conversation), the agent's session of that key is returned "
            "if it exists, so starting again after a restart finds the same session. Returns the session; "
            "pass its `id` to remember, context_build, decay_report and session_end."
        ),
        properties={
            "agent": AGENT_ARG | {"maxLength": NAME_MAX_LENGTH},
            "user_id": _string("The user the session is with.", max_length=NAME_MAX_LENGTH),
            "model": _string("The model the agent uses (its token budget).", max_length=NAME_MAX_LENGTH),
            "key": _string(
                "Your own id for this conversation, unique per agent: the same key returns the same session.",
                max_length=NAME_MAX_LENGTH,
            ),
        },
        required=("agent",),
        scope="write",
        idempotent=False,
        request=lambda a: Call("POST", "/sessions", body=_given(a, ("agent", "user_id", "model", "key"))),
    ),
    _by_id(
        "session_end",
        "End a session: its important facts are promoted to long-term memory. Ending twice is harmless.",
        ("POST", "/sessions/{}/end", "session"),
        scope="write",
    ),
    ToolSpec(
        name="experience_record",
        description=(
            "Record a lesson in long-term memory: a problem, its cause and the solution that worked. An "
            "exact duplicate merges into the existing experience (`outcome`)."
        ),
        properties={
            "problem": _string("What went wrong or was asked (non-empty).", max_length=10_000),
            "solution": _string("What worked.", max_length=20_000),
            "cause": _string("Why it happened.", max_length=10_000),
            "confidence": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "default": 0.5,
                "description": "How sure you are that the solution works, 0 to 1.",
            },
            "user_id": _string("The user it is about (default: every user).", max_length=NAME_MAX_LENGTH),
        },
        required=("problem",),
        scope="write",
        request=lambda a: Call(
            "POST", "/experiences", body=_given(a, ("problem", "solution", "cause", "confidence", "user_id"))
        ),
    ),
    _by_id(
        "recovered_state",
        "Everything an agent needs to resume after a crash: the fold of its events, its latest "
        "checkpoint and current state, its latest session with recent messages, and its open tasks.",
        ("GET", "/agents/{}/recovered-state", "agent"),
        scope="read",
    ),
    ToolSpec(
        name="memory_list",
        description=(
            "What is known about a user: their current memories (profile, preferences, decisions, "
            "constraints, plans, facts), or those current at a past moment (`as_of`). Returns `items` "
            "(id, subject, type, text, sources, confidence, valid_from, valid_to, superseded_by), newest "
            "first; `next` (null on the last page) is the `cursor` of the next page."
        ),
        properties={
            "user_id": USER_ARG,
            "as_of": _string("An ISO 8601 moment, e.g. 2026-03-01T00:00:00Z: the memories current then."),
            "type": _string("Only memories of this type.", enum=MEMORY_TYPES),
            "cursor": _string("The `next` of the previous page."),
            "limit": _integer(
                "Memories per page (default: the server's page size, CTXAPP_PAGE_SIZE).",
                minimum=1,
                maximum=FACTS_MAX_LIMIT,
            ),
        },
        scope="read",
        request=_memory_list,
        path_arguments=("user_id",),
    ),
    ToolSpec(
        name="memory_update",
        description=(
            "Correct a current memory about a user: the answer is a new version (its own id) that "
            "supersedes it, with the same subject; the old value stays in the history. Updating a "
            "memory that is no longer current is refused (memory_superseded): update the newer one."
        ),
        properties={
            "user_id": USER_ARG,
            "memory": MEMORY_ARG,
            "text": _string("The corrected text (non-empty).", max_length=USER_MEMORY_TEXT_MAX_LENGTH),
            "type": _string("The corrected type.", enum=MEMORY_TYPES),
            "confidence": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "description": "How sure the memory is, 0 to 1.",
            },
        },
        scope="write",
        request=_memory_update,
        path_arguments=("user_id", "memory"),
    ),
    ToolSpec(
        name="memory_forget",
        description=(
            "Erase one memory about a user, with every earlier version of its subject (later versions "
            "stay). Cannot be undone. Returns the erased ids."
        ),
        properties={"user_id": USER_ARG, "memory": MEMORY_ARG},
        scope="write",
        destructive=True,
        request=_memory_forget,
        path_arguments=("user_id", "memory"),
    ),
    ToolSpec(
        name="decay_report",
        description=(
            "The session's tracked facts that have decayed (not referenced for too many rounds), most "
            "urgent first, each with a recommendation (restate_now, consider_restating, no_action). "
            "`next_cursor` (null on the last page) is the `cursor` of the next page."
        ),
        properties={
            "session": SESSION_ARG,
            "cursor": _string("The `next_cursor` of the previous page."),
            "limit": _integer("Facts per page (default 100).", minimum=1, maximum=FACTS_MAX_LIMIT),
        },
        scope="read",
        request=_decay_report,
        path_arguments=("session",),
    ),
)


def tools_allowed(scopes: frozenset[str]) -> list[ToolSpec]:
    """The tools a key with these scopes may call (`admin` may call all)."""
    return [spec for spec in TOOLS if "admin" in scopes or spec.scope in scopes]


class CtxappMCPServer(MCPServer):
    """MCPServer whose tools are `TOOLS`: listed for the caller's key, each call one REST request."""

    async def list_tools(self) -> list[Tool]:
        backend = _backend()
        return [spec.listed() for spec in tools_allowed(await backend.scopes())]

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> CallToolResult:
        try:
            result = await _tool_call(name, arguments)
        except ToolError as exc:
            return CallToolResult(content=[TextContent(type="text", text=str(exc))], is_error=True)
        body = result if isinstance(result, dict) else {"result": result}
        return CallToolResult(
            content=[TextContent(type="text", text=json.dumps(body, indent=2))], structured_content=body
        )


def _backend() -> Backend:
    backend = current_backend.get(None)
    if backend is None:
        raise tool_error("unauthenticated", "this MCP connection is not authenticated.")
    return backend


async def _tool_call(name: str, arguments: dict[str, Any]) -> Any:
    backend = _backend()
    spec = next((s for s in TOOLS if s.name == name), None)
    if spec is None:
        raise tool_error("not_found", f"No tool named {name!r}.")
    if spec not in tools_allowed(await backend.scopes()):
        raise tool_error("forbidden", f"This API key lacks the '{spec.scope}' scope this tool needs.")
    return await backend.send(spec.call(arguments))


def build_server() -> MCPServer:
    """The MCP server with ctxapp's tools; each call uses the backend its transport set."""
    return CtxappMCPServer("ctxapp", instructions=INSTRUCTIONS, version=_version())


def _version() -> str:
    try:
        return version("ctxapp")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


# --- stdio: `ctxapp mcp` ----------------------------------------------------------------------


class ToolClient(Client):
    """The Python client, with the one operation the tools need: any request under /api/v1."""

    @operation
    def tool_request(call: Call) -> Request[Any]:
        return Request(call.method, call.path, params=call.params, json=call.body)


class ClientBackend:
    """Over the REST API with the Python client (the stdio transport)."""

    def __init__(self, client: ToolClient) -> None:
        self.client = client
        self._scopes: frozenset[str] | None = None

    async def send(self, call: Call) -> Any:
        try:
            return await asyncio.to_thread(self.client.tool_request, call)
        except CtxappError as exc:
            raise tool_error(exc.code, exc.message) from None

    async def scopes(self) -> frozenset[str]:
        if self._scopes is None:
            try:
                tenant = await self.send(Call("GET", "/tenant"))
                self._scopes = frozenset(tenant["scopes"])
            except ToolError as exc:
                if not str(exc).startswith("forbidden:"):
                    raise
                # GET /tenant needs `read`; a key refused it has neither read nor admin: write only.
                self._scopes = frozenset({"write"})
        return self._scopes


def run_stdio(*, url: str, api_key: str) -> None:
    """Serve the tools on stdin/stdout, calling the REST API at `url` with `api_key`."""
    # One line per HTTP request at INFO would fill the host's log of this server's stderr.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    server = build_server()
    client = ToolClient(url, api_key)
    with client:
        current_backend.set(ClientBackend(client))
        server.run("stdio")
