"""LangChain adapters: a chat message history backed by a ctxapp session, and a retriever over
ctxapp's memory search.

    pip install 'ctxapp[langchain]'

    from ctxapp.client import Client
    from ctxapp.integrations.langchain import CtxappChatMessageHistory, CtxappRetriever

    history = CtxappChatMessageHistory(Client(url, key), agent="support-bot", user_id="u-7")
    history.add_messages([HumanMessage("My parcel is late"), AIMessage("Let me check.")])

    retriever = CtxappRetriever(client=Client(url, key), k=5, session=history.session_id)
    docs = retriever.invoke("parcel delayed at customs")  # this and the user's earlier sessions

Every LangChain message class, chunks included, comes back as it went in, field for field (tested
against langchain-core's InMemoryChatMessageHistory). The role is ctxapp's: HumanMessage ↔ user,
AIMessage ↔ assistant (its `tool_calls` ↔ ctxapp tool calls, arguments as JSON text),
ToolMessage ↔ tool (`tool_call_id`), SystemMessage ↔ system, FunctionMessage ↔ tool (answering
its function's name); a ChatMessage keeps its role when ctxapp knows it, else it is a user turn.
Everything else LangChain's own serialization (`message_to_dict`) holds (the class, id, name,
additional_kwargs, response_metadata, usage_metadata, invalid_tool_calls, tool call chunks, a
ToolMessage's artifact and status, content given as a list of parts) is kept in the ctxapp
message's `metadata.langchain`, so it must be JSON and, with the rest of the metadata, within
the server's CTXAPP_MAX_JSON_FIELD_BYTES (64 KiB by default).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from ctxapp.client import AsyncClient, Client

__all__ = ["CtxappChatMessageHistory", "CtxappRetriever", "message_from_ctxapp", "message_to_ctxapp"]

NAME_MAX_LENGTH = 200  # a ctxapp message's `name`
CTXAPP_ROLES = {"user", "assistant", "tool", "system"}
TYPE_OF_ROLE = {"user": "human", "assistant": "ai", "tool": "tool", "system": "system"}
# Fields a message class takes from ctxapp's own columns rather than from `metadata.langchain`.
COLUMN_FIELDS = frozenset({"content", "type", "tool_call_id"})


def _role(message: BaseMessage) -> str:
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, ToolMessage | FunctionMessage):
        return "tool"
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, ChatMessage) and message.role in CTXAPP_ROLES:
        return message.role
    return "user"


def _kept_fields(message: BaseMessage) -> dict[str, Any]:
    """The message's fields as LangChain serializes them, but for those ctxapp's columns hold and
    those at their class default (so a plain message adds little to the metadata)."""
    data: dict[str, Any] = message_to_dict(message)["data"]
    fields = type(message).model_fields
    kept = {}
    for name, value in data.items():
        if name in COLUMN_FIELDS:
            continue
        default = fields[name].get_default(call_default_factory=True) if name in fields else None
        if name in fields and not fields[name].is_required() and value == default:
            continue
        kept[name] = value
    if isinstance(message, AIMessage):
        kept.pop("tool_calls", None)  # ctxapp's tool_calls column (a chunk derives them from its chunks)
        if isinstance(message, AIMessageChunk) and message.tool_call_chunks:
            kept.pop("invalid_tool_calls", None)
    return kept


def _tool_calls(message: AIMessage) -> list[dict[str, Any]]:
    """The message's tool calls as ctxapp's: a call LangChain made without an id gets one here,
    which ctxapp needs to pair it with its answer; the message's metadata says it had none."""
    return [
        {
            "id": call.get("id") or f"lc_{uuid.uuid4().hex}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["args"], ensure_ascii=False)},
        }
        for call in message.tool_calls
    ]


def message_to_ctxapp(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as a ctxapp message body. Pure, but for the id a tool call without
    one is given. A RemoveMessage is refused (ValueError): it tells LangGraph's `add_messages`
    to drop a message, it is not one, and a ctxapp session is append-only."""
    if isinstance(message, RemoveMessage):
        raise ValueError(
            "A RemoveMessage is not a message to store; ctxapp sessions are append-only "
            "(clear() starts the history over)."
        )
    langchain: dict[str, Any] = {"type": message.type, "data": _kept_fields(message)}
    content = message.content
    if not isinstance(content, str):
        langchain["content_parts"] = True
        content = json.dumps(content, ensure_ascii=False)
    body: dict[str, Any] = {"role": _role(message), "content": content, "metadata": {"langchain": langchain}}
    if isinstance(message.name, str) and 0 < len(message.name) <= NAME_MAX_LENGTH:
        body["name"] = message.name  # searchable as the speaker
    if isinstance(message, AIMessage) and message.tool_calls:
        body["tool_calls"] = _tool_calls(message)
        ids = [call.get("id") for call in message.tool_calls]
        if None in ids or "" in ids:
            langchain["tool_call_ids"] = ids
    if isinstance(message, ToolMessage):
        body["tool_call_id"] = message.tool_call_id
    elif isinstance(message, FunctionMessage):
        body["tool_call_id"] = message.name
    return body


def message_from_ctxapp(item: dict[str, Any]) -> BaseMessage:
    """A ctxapp message (as the API returns it) as a LangChain message. Pure.

    A message this adapter wrote comes back as the class and fields it had; one written by another
    client as the LangChain class of its role."""
    kept = (item.get("metadata") or {}).get("langchain") or {}
    role = item.get("role")
    content: Any = item.get("content") or ""
    if kept.get("content_parts"):
        content = json.loads(content)
    # Older versions kept only the id, name and a ChatMessage's role, beside the type.
    data: dict[str, Any] = dict(
        kept.get("data") or {k: kept[k] for k in ("id", "name", "role") if kept.get(k)}
    )
    kind = kept.get("type") or ("chat" if "role" in data else TYPE_OF_ROLE.get(str(role), "human"))
    data["content"] = content
    if kind in ("ai", "AIMessageChunk") and not data.get("tool_call_chunks"):
        calls = item.get("tool_calls") or []
        ids = kept.get("tool_call_ids") or [call["id"] for call in calls]
        data["tool_calls"] = [
            {
                "id": call_id or None,
                "name": call["function"]["name"],
                "args": _arguments(call["function"].get("arguments")),
                "type": "tool_call",
            }
            for call, call_id in zip(calls, ids, strict=False)
        ]
    if kind in ("tool", "ToolMessageChunk"):
        data["tool_call_id"] = item.get("tool_call_id") or ""
    if kind in ("function", "FunctionMessageChunk"):
        data.setdefault("name", item.get("tool_call_id") or "")
    try:
        return messages_from_dict([{"type": kind, "data": data}])[0]
    except ValueError:  # a class this langchain-core does not know: its role's
        data = {key: data[key] for key in ("content", "id", "name") if key in data}
        return messages_from_dict([{"type": TYPE_OF_ROLE.get(str(role), "human"), "data": data}])[0]


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"__raw__": raw}
    return value if isinstance(value, dict) else {"__value__": value}


SESSION_ID_PREFIX = "sess_"
DEFAULT_AGENT = "langchain"  # the agent of a history named by the application's own id alone


class CtxappChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history that is a ctxapp session.

    `session_id` is a ctxapp session id (`sess_…`) to continue that session, or the application's
    own id of the conversation (any other string, e.g. `"conv-r1"`): the session of `agent`
    (default `"langchain"`) with that key, opened on first use and found again by every later
    history with the same key. Without `session_id`, `agent` (and optionally `user_id`, `model`)
    opens a new session on the first write. `add_messages` appends its messages in ONE batch (all
    or nothing, consecutive seqs). ctxapp messages are append-only, so `clear()` starts over: for
    a session id it ENDS the session by default (its messages and events stay, for the dashboard
    and recall) and the history continues in a new session of the same agent and user; with
    `clear_mode="delete"`, and always for an application key (which names one session), it
    deletes the session and its messages instead. `session_id` names the ctxapp session the
    history writes to now (None until a keyed or new one is opened); `key` the application's.
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        session_id: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        model: str | None = None,
        clear_mode: Literal["end", "delete"] | None = None,
    ) -> None:
        if client is None and async_client is None:
            raise ValueError("CtxappChatMessageHistory needs a ctxapp Client, an AsyncClient, or both.")
        if session_id is None and agent is None:
            raise ValueError(
                "Pass session_id (a session, or your own conversation id) or agent (to open one)."
            )
        self.key = (
            session_id if session_id is not None and not session_id.startswith(SESSION_ID_PREFIX) else None
        )
        if self.key is not None and clear_mode == "end":
            raise ValueError(
                "A history named by your own id clears by deleting its session (clear_mode='delete')."
            )
        self.client = client
        self.async_client = async_client
        self.session_id = None if self.key is not None else session_id
        self.agent = agent or (DEFAULT_AGENT if self.key is not None else None)
        self.user_id = user_id
        self.model = model
        self.clear_mode = clear_mode or ("delete" if self.key is not None else "end")

    def _sync(self) -> Client:
        if self.client is None:
            raise RuntimeError("This history has only an AsyncClient: use the a… methods.")
        return self.client

    def _async(self) -> AsyncClient:
        if self.async_client is None:
            raise RuntimeError("This history has only a sync Client: use the sync methods.")
        return self.async_client

    def _remember_agent(self, session: dict[str, Any]) -> None:
        self.agent = session.get("agent") or self.agent
        self.user_id = session.get("user_id") or self.user_id

    def _opened(self, session: dict[str, Any]) -> str:
        self.session_id = str(session["id"])
        return self.session_id

    def _open_args(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "model": self.model, "key": self.key}

    # --- sync ------------------------------------------------------------------------------------
    def _session(self) -> str:
        """The session written to: opened now when there is none (for a key: found or opened)."""
        if self.session_id is not None:
            return self.session_id
        assert self.agent is not None
        return self._opened(dict(self._sync().session_create(self.agent, **self._open_args())))

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        if self.session_id is None and self.key is None:
            return []
        return [message_from_ctxapp(dict(item)) for item in self._sync().messages_iter(self._session())]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        self._sync().messages_append(self._session(), [message_to_ctxapp(m) for m in messages])

    def clear(self) -> None:
        if self.session_id is None and self.key is None:
            return
        client = self._sync()
        session_id = self._session()
        self._remember_agent(dict(client.session_get(session_id)))
        if self.clear_mode == "delete":
            client.session_delete(session_id)
        else:
            client.session_end(session_id)
        self.session_id = None  # the next write opens a new session of the same agent and user (and key)

    # --- async -----------------------------------------------------------------------------------
    async def _asession(self) -> str:
        if self.session_id is not None:
            return self.session_id
        assert self.agent is not None
        return self._opened(dict(await self._async().session_create(self.agent, **self._open_args())))

    async def aget_messages(self) -> list[BaseMessage]:
        if self.session_id is None and self.key is None:
            return []
        session_id = await self._asession()
        return [message_from_ctxapp(dict(item)) async for item in self._async().messages_iter(session_id)]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if not messages:
            return
        session_id = await self._asession()
        await self._async().messages_append(session_id, [message_to_ctxapp(m) for m in messages])

    async def aclear(self) -> None:
        if self.session_id is None and self.key is None:
            return
        client = self._async()
        session_id = await self._asession()
        self._remember_agent(dict(await client.session_get(session_id)))
        if self.clear_mode == "delete":
            await client.session_delete(session_id)
        else:
            await client.session_end(session_id)
        self.session_id = None


class CtxappRetriever(BaseRetriever):
    """A LangChain retriever over ctxapp's memory search (`POST /api/v1/memory/search`).

    It finds earlier conversation turns (of this and earlier sessions), session summaries, tracked
    facts and experiences, ranked by meaning and words. Scope, as the API's: `session` with
    `sessions="all"` (default) covers every session of that session's user (or agent, when it
    has no user), `sessions="current"` only that session; `agent` and `user_id` narrow to that
    agent's / user's sessions; none of them searches the whole tenant. `kinds` picks any of
    message, summary, fact, experience (default all); `neighbours` (0..5) adds the turns around
    each message hit; `search_kwargs` passes other fields (`time_range`, `plan`) through.

    Each Document's page_content is the hit's text; its metadata carries kind, id (messages:
    `<session>:<seq>`), score, similarity, contributions, session, seq, occurred_at, speaker and,
    when asked for, neighbours.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client | None = None
    async_client: AsyncClient | None = None
    k: int = 5
    agent: str | None = None
    user_id: str | None = None
    session: str | None = None
    sessions: Literal["all", "current"] = "all"
    kinds: list[Literal["message", "summary", "fact", "experience"]] | None = None
    neighbours: int = 0
    search_kwargs: dict[str, Any] = {}

    def _request(self) -> dict[str, Any]:
        scope: dict[str, Any] = {
            k: v
            for k, v in {"agent": self.agent, "user_id": self.user_id, "session": self.session}.items()
            if v is not None
        }
        if self.session is not None:
            scope["sessions"] = self.sessions
        return {
            "scope": scope or None,
            "kinds": list(self.kinds) if self.kinds else None,
            "limit": self.k,
            "neighbours": self.neighbours or None,
            **self.search_kwargs,
        }

    def _search(self, query: str) -> list[dict[str, Any]]:
        if self.client is None:
            raise RuntimeError("This retriever has only an AsyncClient: use ainvoke.")
        found = self.client.memory_search(query, **self._request())
        return [dict(hit) for hit in found["results"]]

    async def _asearch(self, query: str) -> list[dict[str, Any]]:
        if self.async_client is None:
            raise RuntimeError("This retriever has only a sync Client: use invoke.")
        found = await self.async_client.memory_search(query, **self._request())
        return [dict(hit) for hit in found["results"]]

    @staticmethod
    def _document(hit: dict[str, Any]) -> Document:
        metadata = {
            key: hit.get(key)
            for key in ("id", "kind", "score", "similarity", "session", "seq", "occurred_at", "speaker")
        }
        metadata["contributions"] = hit.get("contributions", {})
        if "neighbours" in hit:
            metadata["neighbours"] = hit["neighbours"]
        return Document(page_content=hit["text"], metadata=metadata)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [self._document(hit) for hit in self._search(query)]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [self._document(hit) for hit in await self._asearch(query)]
