"""ctxapp memory as Model Context Protocol tools, on the official `mcp` SDK (MCPServer).

Two transports share one set of tools (`build_server`):

- streamable HTTP at `/mcp` in the ASGI app (ctxapp/mcp/http.py): each tool call is answered
  in-process by the REST view of its route, for the request's API key;
- stdio (`ctxapp mcp`, ctxapp/integrations/mcp_stdio.py): each tool call is one REST request
  through `ctxapp.client.Client`, with the URL and key from `CTXAPP_URL` / `CTXAPP_API_KEY`.

A tool only turns its arguments into one REST request (method, path, body or query); the REST
view's input serializer validates them, so a tool accepts exactly what the API accepts and
refuses the rest with the API's own `code: message`, over both transports alike. The arguments
are therefore not validated by the SDK (pydantic): the schemas listed to the client describe them
(types, bounds, descriptions) and the API enforces them. This module needs no Django. What a tool
is made of: schema.py; the user memory tools: user_memory.py. It imports neither the server nor
the client: both transports import it.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import CallToolResult, TextContent, Tool

from ctxapp.mcp.schema import (
    Bound,
    Call,
    RestError,
    ToolSpec,
    fields_of,
    given,
    integer_arg,
    number_arg,
    refusal_text,
    required_string,
    segment,
    string_arg,
    tool_error,
)
from ctxapp.mcp.user_memory import (
    USER_ARG,
    USER_BOUND,
    USER_MEMORY_INPUT,
    USER_MEMORY_TOOLS,
    user_memory_remember,
)

# Where the REST API enforces the tools' arguments (bounds.py reads them there).
SEARCH = "memory.api.memory:MemorySearchApi.InputSerializer"
SCOPE = "memory.api.memory:ScopeSerializer"
MESSAGE = "memory.api.message_inputs:MessageInputSerializer"
FACT = "memory.api.decay:FactsApi.InputSerializer"
FACTS_QUERY = "memory.api.decay:FactsApi.ListQuerySerializer"
SESSION_CREATE = "memory.api.sessions:SessionListCreateApi.InputSerializer"
CONTEXT = "memory.api.context:SessionContextApi.InputSerializer"
EXPERIENCE = "memory.api.experiences:ExperienceListApi.InputSerializer"
SESSION_ID = Bound("memory.models:Session", "public_id")
AGENT_ID = Bound("memory.models:Agent", "external_id")
SCOPE_FIELDS = {"agent": "agent", "user_id": "user_id", "session": "session", "sessions": "sessions"}
FACT_FIELDS = {"fact_type": "type"}

INSTRUCTIONS = (
    "ctxapp is the agent's memory. Start a session with session_start, store each turn with remember, "
    "ask context_build for the next prompt, search earlier turns, summaries, facts and experiences (this "
    "and earlier sessions) with memory_search, keep what you learn about the user with remember "
    '(kind="user_memory") and read or correct it with memory_list and memory_update, record what '
    "worked with experience_record, and end the session with session_end. After a crash, "
    "recovered_state returns everything needed to resume."
)


class Backend(Protocol):
    """Where a tool's REST request is answered. Errors come back as RestError (code, message,
    details) or ToolError('code: message')."""

    async def send(self, call: Call) -> Any: ...

    async def scopes(self) -> frozenset[str]:
        """The scopes of the caller's API key (`read`, `write`, `admin`)."""
        ...

    async def tools(self, specs: list[ToolSpec]) -> list[Tool]:
        """The tools as listed to the client, with the bounds the server enforces."""
        ...


current_backend: contextvars.ContextVar[Backend] = contextvars.ContextVar("ctxapp_mcp_backend")


def fact_key(fact_type: str, content: str) -> str:
    """A stable key for a fact registered without one: the same text registers (updates) one fact."""
    words = re.findall(r"[a-z0-9]+", content.lower())[:6]
    digest = hashlib.sha256(content.strip().encode()).hexdigest()[:8]
    return f"{fact_type}:{'-'.join(words) or 'fact'}-{digest}"[:200]


def _search(arguments: dict[str, Any]) -> Call:
    body = given(arguments, ("query", "kinds", "limit", "neighbours"))
    scope = given(arguments, tuple(SCOPE_FIELDS))
    if scope:
        body["scope"] = scope
    return Call("POST", "/memory/search", body=body, fields=fields_of(SCOPE_FIELDS, "scope."))


def _remember(arguments: dict[str, Any]) -> Call:
    kind = arguments.get("kind", "message")
    if kind == "user_memory":
        return user_memory_remember(arguments)
    session = segment(required_string(arguments, "session"))
    if kind == "message":
        body = {"role": "user", **given(arguments, ("role", "content"))}
        return Call("POST", f"/sessions/{session}/messages", body=body)
    if kind != "fact":
        raise tool_error("validation_error", f'kind: "{kind}" is not a valid choice.')
    for name in ("user_id", "subject", "memory_type"):
        if name in arguments:
            raise tool_error("validation_error", f"{name}: Only with kind=user_memory.")
    body = given(arguments, ("key", "content", "fact_type"), FACT_FIELDS)
    body.setdefault("type", "constraint")
    if "key" not in body and isinstance(body.get("content"), str) and isinstance(body["type"], str):
        body["key"] = fact_key(body["type"], body["content"])
    return Call("POST", f"/sessions/{session}/facts", body=body, fields=fields_of(FACT_FIELDS))


def _decay_report(arguments: dict[str, Any]) -> Call:
    params = {"decayed": "true", **given(arguments, ("cursor", "limit"))}
    return Call("GET", f"/sessions/{segment(arguments['session'])}/facts", params=params)


SESSION_ARG = string_arg("The session id (`sess_…`) from session_start.")
AGENT_ARG = string_arg("The agent's external id (your name for it).")

ID_ARGUMENTS = {"session": (SESSION_ARG, SESSION_ID), "agent": (AGENT_ARG, AGENT_ID)}


def _by_id(name: str, description: str, route: tuple[str, str, str], *, scope: str) -> ToolSpec:
    """A tool whose one argument is the id in its route (`route`: method, path template, argument)."""
    method, template, argument = route
    schema, bound = ID_ARGUMENTS[argument]
    return ToolSpec(
        name=name,
        description=description,
        properties={argument: schema},
        bounds={argument: (bound,)},
        scope=scope,
        request=lambda a: Call(method, template.format(segment(a[argument]))),
        path_arguments=(argument,),
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="memory_search",
        description=(
            "Search the agent's memory by meaning and keywords: earlier conversation turns (also from "
            "past sessions), session summaries, tracked facts, stored experiences and what is known "
            'about users. Scope: `session` with sessions="all" (default) searches every session of '
            'that session\'s user (or agent, when it has no user), sessions="current" only that '
            "session; `agent` and `user_id` narrow to that agent's / user's sessions; without any of "
            "them the whole tenant is searched. Returns `results`, best first: kind, id, session, seq, "
            "occurred_at, speaker, text, score and each signal's contribution."
        ),
        properties={
            "query": string_arg("What to look for (non-empty)."),
            "session": string_arg("Search around this session (see `sessions`)."),
            "sessions": string_arg(
                "`all`: every session of the session's user (or agent); `current`: only `session`.",
                default="all",
            ),
            "agent": string_arg("Only this agent's sessions."),
            "user_id": string_arg("Only this user's sessions."),
            "kinds": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Which kinds of memory to search (default: all).",
            },
            "limit": integer_arg("How many results at most.", default=10),
            "neighbours": integer_arg("Turns to include either side of each message hit.", default=0),
        },
        bounds={
            **{name: (Bound(SEARCH, name),) for name in ("query", "kinds", "limit", "neighbours")},
            **{name: (Bound(SCOPE, field),) for name, field in SCOPE_FIELDS.items()},
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
            "session": string_arg("The session id (`sess_…`) from session_start; not for kind=user_memory."),
            "content": string_arg(
                "The message text, the fact's text, or the memory about the user (non-empty)."
            ),
            "kind": string_arg(
                "`message`: a conversation turn; `fact`: a fact to keep in view in the session; "
                "`user_memory`: a memory about the user across sessions.",
                enum=("message", "fact", "user_memory"),
                default="message",
            ),
            "role": string_arg("Who said it (kind=message).", default="user"),
            "fact_type": string_arg(
                "The fact's type (kind=fact), lowercase: constraint, decision, goal, preference, …",
                default="constraint",
            ),
            "key": string_arg("The fact's key (kind=fact); default: derived from its type and text."),
            "user_id": USER_ARG | {"description": "The user the memory is about (kind=user_memory)."},
            "subject": string_arg(
                "What the memory is about, e.g. `home.city` (kind=user_memory); a new value replaces it."
            ),
            "memory_type": string_arg("The user memory's type (kind=user_memory).", default="fact"),
        },
        bounds={
            "session": (SESSION_ID,),
            "content": (Bound(MESSAGE, "content"), Bound(FACT, "content"), Bound(USER_MEMORY_INPUT, "text")),
            "role": (Bound(MESSAGE, "role"),),
            "fact_type": (Bound(FACT, "type"),),
            "key": (Bound(FACT, "key"),),
            "user_id": (USER_BOUND,),
            "subject": (Bound(USER_MEMORY_INPUT, "subject"),),
            "memory_type": (Bound(USER_MEMORY_INPUT, "type"),),
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
            "input": string_arg("The upcoming user message (what the prompt is for)."),
            "model": string_arg("The model the prompt is for (its budget); default: the session's model."),
        },
        bounds={
            "session": (SESSION_ID,),
            "input": (Bound(CONTEXT, "input"),),
            "model": (Bound(CONTEXT, "model"),),
        },
        scope="write",
        idempotent=False,
        request=lambda a: Call(
            "POST", f"/sessions/{segment(a['session'])}/context", body=given(a, ("input", "model"))
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
            "agent": AGENT_ARG,
            "user_id": string_arg("The user the session is with."),
            "model": string_arg("The model the agent uses (its token budget)."),
            "key": string_arg(
                "Your own id for this conversation, unique per agent: the same key returns the same session."
            ),
        },
        bounds={name: (Bound(SESSION_CREATE, name),) for name in ("agent", "user_id", "model", "key")},
        required=("agent",),
        scope="write",
        idempotent=False,
        request=lambda a: Call("POST", "/sessions", body=given(a, ("agent", "user_id", "model", "key"))),
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
            "problem": string_arg("What went wrong or was asked (non-empty)."),
            "solution": string_arg("What worked."),
            "cause": string_arg("Why it happened."),
            "confidence": number_arg("How sure you are that the solution works, 0 to 1.", default=0.5),
            "user_id": string_arg("The user it is about (default: every user)."),
        },
        bounds={
            name: (Bound(EXPERIENCE, name),)
            for name in ("problem", "solution", "cause", "confidence", "user_id")
        },
        required=("problem",),
        scope="write",
        request=lambda a: Call(
            "POST", "/experiences", body=given(a, ("problem", "solution", "cause", "confidence", "user_id"))
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
        name="decay_report",
        description=(
            "The session's tracked facts that have decayed (not referenced for too many rounds), most "
            "urgent first, each with a recommendation (restate_now, consider_restating, no_action). "
            "`next_cursor` (null on the last page) is the `cursor` of the next page."
        ),
        properties={
            "session": SESSION_ARG,
            "cursor": string_arg("The `next_cursor` of the previous page."),
            "limit": integer_arg("Facts per page (default 100)."),
        },
        bounds={
            "session": (SESSION_ID,),
            "cursor": (Bound(FACTS_QUERY, "cursor"),),
            "limit": (Bound(FACTS_QUERY, "limit"),),
        },
        scope="read",
        request=_decay_report,
        path_arguments=("session",),
    ),
    *USER_MEMORY_TOOLS,
)


def tools_allowed(scopes: frozenset[str]) -> list[ToolSpec]:
    """The tools a key with these scopes may call (`admin` may call all)."""
    return [spec for spec in TOOLS if "admin" in scopes or spec.scope in scopes]


RECENT_MESSAGES = 50  # the messages of a session's resource: its newest
SESSIONS_LISTED = 50
SESSIONS_URI = "ctxapp://sessions"
MESSAGES_URI = "ctxapp://sessions/{session}/messages"


class CtxappMCPServer(MCPServer):
    """MCPServer whose tools are `TOOLS`: listed for the caller's key, each call one REST request.
    Its resources (the newest sessions, a session's recent messages) are REST reads too."""

    async def list_tools(self) -> list[Tool]:
        backend = _backend()
        return await backend.tools(tools_allowed(await backend.scopes()))

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
    call = spec.call(arguments)
    try:
        return await backend.send(call)
    except RestError as exc:
        raise ToolError(refusal_text(call, exc)) from None


async def _read(call: Call) -> str:
    """A resource's content: the REST answer as JSON text (a refusal as ResourceError)."""
    try:
        return json.dumps(await _backend().send(call), indent=2)
    except ToolError as exc:
        raise ResourceError(str(exc)) from None


async def sessions_resource() -> str:
    """The newest sessions (id, agent, user, status, message count …), newest first."""
    return await _read(Call("GET", "/sessions", params={"limit": SESSIONS_LISTED}))


async def session_messages_resource(session: str) -> str:
    """The session's most recent messages, oldest first."""
    if not session:
        raise ResourceError("validation_error: session: Must be a non-empty string.")
    try:
        found = await _backend().send(Call("GET", f"/sessions/{segment(session)}"))
    except ToolError as exc:
        raise ResourceError(str(exc)) from None
    after = max(0, int(found.get("last_seq") or 0) - RECENT_MESSAGES)
    params = {"after": after, "limit": RECENT_MESSAGES}
    return await _read(Call("GET", f"/sessions/{segment(session)}/messages", params=params))


def build_server() -> MCPServer:
    """The MCP server with ctxapp's tools and resources; each call uses the backend its transport set."""
    server = CtxappMCPServer("ctxapp", instructions=INSTRUCTIONS, version=_version())
    server.resource(
        SESSIONS_URI,
        name="sessions",
        description=f"The {SESSIONS_LISTED} newest sessions of the key's tenant (or agent), as JSON: "
        "`items` (id, agent, user_id, status, last_seq, message_count …), newest first.",
        mime_type="application/json",
    )(sessions_resource)
    server.resource(
        MESSAGES_URI,
        name="session_messages",
        description=f"A session's {RECENT_MESSAGES} most recent messages, as JSON: `items` (seq, role, "
        "content, tool calls, occurred_at), oldest first.",
        mime_type="application/json",
    )(session_messages_resource)
    return server


def _version() -> str:
    try:
        return version("ctxapp")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"
