"""A LangGraph checkpointer (`BaseCheckpointSaver`, sync and async) backed by ctxapp checkpoints.

    pip install 'ctxapp[langgraph]'

    from ctxapp.client import Client
    from ctxapp.integrations.langgraph import CtxappSaver

    graph = builder.compile(checkpointer=CtxappSaver(Client(url, key)))
    graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})

Mapping (docs/integrations.md, "LangChain and LangGraph"):

- a LangGraph thread is a ctxapp agent, `<agent_prefix><thread_id>` (a thread id with characters
  that cannot appear in a URL path is base64url-encoded, `b64-…`), created on first use;
- each `put` is one ctxapp checkpoint of that agent (`POST /api/v1/agents/{agent}/checkpoints`,
  so the thread gets ctxapp's delta storage, diff and dashboard timeline). Its cognitive state's
  `working_memory.langgraph` holds the thread, namespace, checkpoint id and parent id, the
  checkpoint (channel values one by one) and its metadata. A value that is plain JSON is stored as
  JSON (`{"json": …}`, readable and diffable); anything else goes through LangGraph's own serde
  (JsonPlusSerializer) as `{"type": …, "b64": …}`. `reason` is `langgraph` plus the namespace,
  `produced_by` the checkpoint id, `step` the metadata's step;
- `put_writes` records one `agent.langgraph.writes` event on the agent's stream (checkpoint id,
  namespace, task id and path, and the writes in the same encoding); `get_tuple` and `list` read
  them back from the events after the checkpoint (`covers_event_seq`), sorted as LangGraph sorts
  them, a regular write kept once per (task, index) and a special one (error, interrupt…) replaced.

Not supported: `list(None, …)` (listing every thread; ctxapp lists checkpoints per agent) raises
ValueError; `delete_thread` is not implemented (LangGraph's base raises NotImplementedError):
checkpoints follow ctxapp's retention policy, and events are never deleted.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ctxapp.client import AsyncClient, Client, NotFound

__all__ = ["CtxappSaver"]

REASON = "langgraph"
WRITES_EVENT = "agent.langgraph.writes"
THREAD_EVENT = "agent.langgraph.thread"
REASON_MAX = 200
SAFE_THREAD = re.compile(r"^[A-Za-z0-9._:@+=-]{1,150}$")
PAGE = 1000


def _plain(value: Any) -> bool:
    """True if `value` survives JSON exactly, as ctxapp stores it (no tuples, no NUL, no NaN)."""
    if value is None or isinstance(value, bool | int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return "\x00" not in value and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if type(value) is list:
        return all(_plain(item) for item in value)
    if type(value) is dict:
        return all(isinstance(key, str) and _plain(key) and _plain(item) for key, item in value.items())
    return False


def _reason(checkpoint_ns: str) -> str:
    return (f"{REASON} {checkpoint_ns}" if checkpoint_ns else REASON)[:REASON_MAX]


class _Codec:
    """Pure encoding between LangGraph objects and the JSON kept in ctxapp (no I/O)."""

    def __init__(self, serde: SerializerProtocol, agent_prefix: str) -> None:
        self.serde = serde
        self.agent_prefix = agent_prefix

    def agent(self, thread_id: Any) -> str:
        text = str(thread_id)
        if SAFE_THREAD.match(text):
            return self.agent_prefix + text
        return self.agent_prefix + "b64-" + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")

    def pack(self, value: Any) -> dict[str, Any]:
        if _plain(value):
            return {"json": value}
        kind, data = self.serde.dumps_typed(value)
        return {"type": kind, "b64": base64.b64encode(data).decode()}

    def unpack(self, packed: dict[str, Any]) -> Any:
        if "json" in packed:
            return packed["json"]
        return self.serde.loads_typed((packed["type"], base64.b64decode(packed["b64"])))

    def state(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> dict[str, Any]:
        configurable = config["configurable"]
        rest = {key: value for key, value in checkpoint.items() if key != "channel_values"}
        document = {
            "thread_id": str(configurable["thread_id"]),
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": configurable.get("checkpoint_id"),
            "checkpoint": self.pack(rest),
            "channel_values": {key: self.pack(value) for key, value in checkpoint["channel_values"].items()},
            "metadata": self.pack(get_checkpoint_metadata(config, metadata)),
        }
        return {"schema_version": 1, "working_memory": {"langgraph": document}}

    def checkpoint_tuple(
        self, state: dict[str, Any], writes_index: dict[tuple[str, str], list[PendingWrite]]
    ) -> CheckpointTuple:
        document = state["working_memory"]["langgraph"]
        thread_id, checkpoint_ns = document["thread_id"], document["checkpoint_ns"]
        writes = writes_index.get((checkpoint_ns, document["checkpoint_id"]), [])
        checkpoint = self.unpack(document["checkpoint"])
        checkpoint["channel_values"] = {
            key: self.unpack(value) for key, value in document["channel_values"].items()
        }
        parent = document.get("parent_checkpoint_id")
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": checkpoint_ns,
                    "checkpoint_id": document["checkpoint_id"],
                }
            },
            checkpoint=checkpoint,
            metadata=self.unpack(document["metadata"]),
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": checkpoint_ns,
                        "checkpoint_id": parent,
                    }
                }
                if parent
                else None
            ),
            pending_writes=writes,
        )

    def checkpoint_body(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> tuple[str, dict[str, Any]]:
        """(agent, keyword arguments of Client.checkpoint_create) for one `put`."""
        state = self.state(config, checkpoint, metadata)
        step = metadata.get("step")
        body: dict[str, Any] = {
            "reason": _reason(state["working_memory"]["langgraph"]["checkpoint_ns"]),
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "produced_by": checkpoint["id"],
            "state": state,
        }
        return self.agent(config["configurable"]["thread_id"]), body

    def thread_payload(self, config: RunnableConfig) -> dict[str, Any]:
        return {"thread_id": str(config["configurable"]["thread_id"])}

    def writes_payload(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> dict[str, Any]:
        configurable = config["configurable"]
        return {
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": configurable["checkpoint_id"],
            "task_id": task_id,
            "task_path": task_path,
            "writes": [
                [WRITES_IDX_MAP.get(channel, index), channel, self.pack(value)]
                for index, (channel, value) in enumerate(writes)
            ],
        }

    def writes_index(self, events: list[dict[str, Any]]) -> dict[tuple[str, str], list[PendingWrite]]:
        """Pending writes per (namespace, checkpoint id), from `agent.langgraph.writes` events in
        stream order: a regular write is kept once per (task, index), a special one replaced."""
        stored: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Any, str]]] = {}
        for event in events:
            payload = event.get("payload") or {}
            key = (payload.get("checkpoint_ns", ""), payload.get("checkpoint_id", ""))
            bucket = stored.setdefault(key, {})
            for index, channel, value in payload.get("writes", []):
                inner = (payload["task_id"], int(index))
                if inner[1] >= 0 and inner in bucket:
                    continue
                bucket[inner] = (payload["task_id"], channel, value, payload.get("task_path", ""))
        return {
            key: [
                (task_id, channel, self.unpack(value))
                for (task_id, channel, value, _path) in (
                    bucket[inner] for inner in sorted(bucket, key=lambda k: writes_sort_key(bucket[k][3], *k))
                )
            ]
            for key, bucket in stored.items()
        }


class _WritesRange:
    """The writes events loaded so far (seq > `after`), in stream order, and their index."""

    def __init__(self) -> None:
        self.after: int | None = None
        self.events: list[dict[str, Any]] = []
        self.index: dict[tuple[str, str], list[PendingWrite]] = {}

    def extend(self, after: int, earlier: list[dict[str, Any]], codec: _Codec) -> None:
        self.events = earlier + self.events
        self.after = after
        self.index = codec.writes_index(self.events)


def _matches(item: dict[str, Any], checkpoint_ns: str | None) -> bool:
    """Could this checkpoint (metadata only) be in `checkpoint_ns` (None: any)? The reason may be
    truncated, so a long namespace is confirmed from the state."""
    reason = item.get("reason") or ""
    if not (reason == REASON or reason.startswith(REASON + " ")):
        return False
    return checkpoint_ns is None or reason == _reason(checkpoint_ns)


def _candidates(
    items: list[dict[str, Any]],
    *,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    before: str | None,
) -> list[dict[str, Any]]:
    """Checkpoint metadata rows of the agent that may answer, newest checkpoint id first, one per
    (reason, checkpoint id) (a re-put of the same id: its newest checkpoint wins)."""
    chosen: dict[tuple[str, str], dict[str, Any]] = {}
    for item in items:
        produced_by = item.get("produced_by") or ""
        if not _matches(item, checkpoint_ns):
            continue
        if checkpoint_id is not None and produced_by != checkpoint_id:
            continue
        if before is not None and produced_by >= before:
            continue
        key = (item.get("reason") or "", produced_by)
        if key not in chosen or item["seq"] > chosen[key]["seq"]:
            chosen[key] = item
    return sorted(chosen.values(), key=lambda item: (item["produced_by"], item["seq"]), reverse=True)


def _filter_ok(metadata: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    return not filter or all(metadata.get(key) == value for key, value in filter.items())


class CtxappSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in ctxapp. Give it a sync `Client`, an `AsyncClient`, or both (the
    sync methods need the first, the `a…` methods the second)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        agent_prefix: str = "langgraph-",
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if client is None and async_client is None:
            raise ValueError("CtxappSaver needs a ctxapp Client, an AsyncClient, or both.")
        self.client = client
        self.async_client = async_client
        self.codec = _Codec(self.serde, agent_prefix)

    # --- helpers -----------------------------------------------------------------------------
    @property
    def _sync(self) -> Client:
        if self.client is None:
            raise RuntimeError("This CtxappSaver has only an AsyncClient: use the a… methods.")
        return self.client

    @property
    def _async(self) -> AsyncClient:
        if self.async_client is None:
            raise RuntimeError("This CtxappSaver has only a sync Client: use the sync methods.")
        return self.async_client

    def _all_checkpoints(self, agent: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        try:
            while True:
                page = self._sync.checkpoints_list(agent, cursor=cursor, limit=PAGE)
                items.extend(page["items"])
                cursor = page["next_cursor"]
                if not cursor:
                    return items
        except NotFound:
            return []

    async def _aall_checkpoints(self, agent: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        try:
            while True:
                page = await self._async.checkpoints_list(agent, cursor=cursor, limit=PAGE)
                items.extend(page["items"])
                cursor = page["next_cursor"]
                if not cursor:
                    return items
        except NotFound:
            return []

    # Pending writes of a checkpoint are the writes events after its own `checkpoint.created`
    # event. Walking checkpoints newest first, each older one extends the loaded range backwards
    # (events after its seq, up to where the range already starts) instead of re-reading it all.
    def _writes_load(self, agent: str, loaded: _WritesRange, after: int) -> None:
        if loaded.after is not None and after >= loaded.after:
            return
        earlier = []
        for event in self._sync.events_iter(agent, after=after, type=WRITES_EVENT):
            if loaded.after is not None and event["seq"] > loaded.after:
                break
            earlier.append(dict(event))
        loaded.extend(after, earlier, self.codec)

    async def _awrites_load(self, agent: str, loaded: _WritesRange, after: int) -> None:
        if loaded.after is not None and after >= loaded.after:
            return
        earlier = []
        async for event in self._async.events_iter(agent, after=after, type=WRITES_EVENT):
            if loaded.after is not None and event["seq"] > loaded.after:
                break
            earlier.append(dict(event))
        loaded.extend(after, earlier, self.codec)

    @staticmethod
    def _query(config: RunnableConfig | None) -> tuple[str, str | None, str | None]:
        if config is None:
            raise ValueError(
                "CtxappSaver lists the checkpoints of one thread: pass {'configurable': {'thread_id': …}}."
            )
        configurable = config["configurable"]
        return str(configurable["thread_id"]), configurable.get("checkpoint_ns"), get_checkpoint_id(config)

    # --- sync ----------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, checkpoint_ns, checkpoint_id = self._query(config)
        return next(
            self._tuples(thread_id, checkpoint_ns or "", checkpoint_id, before=None, filter=None, limit=1),
            None,
        )

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        thread_id, checkpoint_ns, checkpoint_id = self._query(config)
        yield from self._tuples(
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            before=get_checkpoint_id(before) if before else None,
            filter=filter,
            limit=limit,
        )

    def _tuples(
        self,
        thread_id: str,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        *,
        before: str | None,
        filter: dict[str, Any] | None,
        limit: int | None,
    ) -> Iterator[CheckpointTuple]:
        if limit is not None and limit <= 0:
            return
        agent = self.codec.agent(thread_id)
        rows = _candidates(
            self._all_checkpoints(agent),
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            before=before,
        )
        loaded = _WritesRange()
        count = 0
        for row in rows:
            state = self._sync.checkpoint_get(agent, row["seq"])["state"]
            document = state["working_memory"]["langgraph"]
            if checkpoint_ns is not None and document["checkpoint_ns"] != checkpoint_ns:
                continue
            if not _filter_ok(self.codec.unpack(document["metadata"]), filter):
                continue
            self._writes_load(agent, loaded, row["covers_event_seq"])
            yield self.codec.checkpoint_tuple(state, loaded.index)
            count += 1
            if limit is not None and count >= limit:
                return

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        agent, body = self.codec.checkpoint_body(config, checkpoint, metadata)
        try:
            self._sync.checkpoint_create(agent, **body)
        except NotFound:  # a new thread: its agent comes into being with an event
            self._sync.event_emit(agent, THREAD_EVENT, self.codec.thread_payload(config))
            self._sync.checkpoint_create(agent, **body)
        return self._stored_config(config, checkpoint)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        agent = self.codec.agent(config["configurable"]["thread_id"])
        self._sync.event_emit(
            agent, WRITES_EVENT, self.codec.writes_payload(config, writes, task_id, task_path)
        )

    # --- async ---------------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, checkpoint_ns, checkpoint_id = self._query(config)
        async for found in self._atuples(
            thread_id, checkpoint_ns or "", checkpoint_id, before=None, filter=None, limit=1
        ):
            return found
        return None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        thread_id, checkpoint_ns, checkpoint_id = self._query(config)
        async for found in self._atuples(
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            before=get_checkpoint_id(before) if before else None,
            filter=filter,
            limit=limit,
        ):
            yield found

    async def _atuples(
        self,
        thread_id: str,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        *,
        before: str | None,
        filter: dict[str, Any] | None,
        limit: int | None,
    ) -> AsyncIterator[CheckpointTuple]:
        if limit is not None and limit <= 0:
            return
        agent = self.codec.agent(thread_id)
        rows = _candidates(
            await self._aall_checkpoints(agent),
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            before=before,
        )
        loaded = _WritesRange()
        count = 0
        for row in rows:
            state = (await self._async.checkpoint_get(agent, row["seq"]))["state"]
            document = state["working_memory"]["langgraph"]
            if checkpoint_ns is not None and document["checkpoint_ns"] != checkpoint_ns:
                continue
            if not _filter_ok(self.codec.unpack(document["metadata"]), filter):
                continue
            await self._awrites_load(agent, loaded, row["covers_event_seq"])
            yield self.codec.checkpoint_tuple(state, loaded.index)
            count += 1
            if limit is not None and count >= limit:
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        agent, body = self.codec.checkpoint_body(config, checkpoint, metadata)
        try:
            await self._async.checkpoint_create(agent, **body)
        except NotFound:
            await self._async.event_emit(agent, THREAD_EVENT, self.codec.thread_payload(config))
            await self._async.checkpoint_create(agent, **body)
        return self._stored_config(config, checkpoint)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        agent = self.codec.agent(config["configurable"]["thread_id"])
        payload = self.codec.writes_payload(config, writes, task_id, task_path)
        await self._async.event_emit(agent, WRITES_EVENT, payload)

    # --- shared --------------------------------------------------------------------------------
    @staticmethod
    def _stored_config(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": config["configurable"]["thread_id"],
                "checkpoint_ns": config["configurable"].get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def get_next_version(self, current: str | None, channel: None) -> str:
        # Versions as InMemorySaver makes them: zero-padded counters compare correctly as strings.
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}"
