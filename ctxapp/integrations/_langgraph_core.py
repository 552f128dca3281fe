"""The sans-IO core of the LangGraph checkpointer (langgraph.py): how LangGraph objects are kept
in ctxapp (`Codec`), which checkpoints answer a query, and each saver operation as a generator of
client calls (`Call`), which the sync and async drivers in langgraph.py carry out. No I/O here.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ctxapp.client import AsyncClient, Client, CtxappError, NotFound

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


class Codec:
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


# --- the saver's operations -------------------------------------------------------------------
# Each operation is a generator over the client: it yields a `Call` and is sent the client's
# answer (or thrown its CtxappError), and yields each CheckpointTuple it finds. The sync and the
# async methods of the saver differ only in the driver that makes the calls.


@dataclass(frozen=True)
class Call:
    """One client call an operation needs: `client.<name>(*args, **kwargs)`, awaited if async."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def on(self, client: Client | AsyncClient) -> Any:
        return getattr(client, self.name)(*self.args, **self.kwargs)


Steps = Generator[Any, Any, Any]  # yields Call or CheckpointTuple, is sent each call's answer


DONE: Any = object()  # what `resume` answers once an operation has finished


def resume(steps: Steps, answer: Any = None, error: CtxappError | None = None) -> Any:
    """An operation's next item (a Call or a CheckpointTuple) after the answer (or the error) of its
    last call; DONE when it has finished."""
    try:
        return steps.throw(error) if error is not None else steps.send(answer)
    except StopIteration:
        return DONE


def _all_checkpoints(agent: str) -> Steps:
    """Every checkpoint (metadata) of the agent, page by page; none for an agent not yet created."""
    items: list[dict[str, Any]] = []
    cursor = None
    try:
        while True:
            page = yield Call("checkpoints_list", (agent,), {"cursor": cursor, "limit": PAGE})
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if not cursor:
                return items
    except NotFound:
        return []


# Pending writes are keyed by (namespace, checkpoint id, task id, index), as in LangGraph's own
# savers, whatever their position in the stream: under durability "async" and "exit" LangGraph
# stores a step's writes before (or without) the checkpoint they belong to, so every writes event
# of the thread is read, once per operation and only when a checkpoint is found.
def _writes_load(agent: str, codec: Codec) -> Steps:
    events: list[dict[str, Any]] = []
    cursor: int | None = 0
    while cursor is not None:
        page = yield Call("events_list", (agent,), {"after": cursor, "limit": PAGE, "type": WRITES_EVENT})
        events.extend(page["items"])
        cursor = page["next_after"] if page["items"] else None
    return codec.writes_index(events)


def tuples_steps(
    codec: Codec,
    thread_id: str,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    *,
    before: str | None,
    filter: dict[str, Any] | None,
    limit: int | None,
) -> Steps:
    """The thread's checkpoints that match, newest first, as CheckpointTuples (at most `limit`)."""
    if limit is not None and limit <= 0:
        return
    agent = codec.agent(thread_id)
    rows = _candidates(
        (yield from _all_checkpoints(agent)),
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        before=before,
    )
    index: dict[tuple[str, str], list[PendingWrite]] | None = None
    count = 0
    for row in rows:
        state = (yield Call("checkpoint_get", (agent, row["seq"])))["state"]
        document = state["working_memory"]["langgraph"]
        if checkpoint_ns is not None and document["checkpoint_ns"] != checkpoint_ns:
            continue
        if not _filter_ok(codec.unpack(document["metadata"]), filter):
            continue
        if index is None:
            index = yield from _writes_load(agent, codec)
        yield codec.checkpoint_tuple(state, index)
        count += 1
        if limit is not None and count >= limit:
            return


def put_steps(
    codec: Codec, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
) -> Steps:
    agent, body = codec.checkpoint_body(config, checkpoint, metadata)
    try:
        yield Call("checkpoint_create", (agent,), body)
    except NotFound:  # a new thread: its agent comes into being with an event
        yield Call("event_emit", (agent, THREAD_EVENT, codec.thread_payload(config)))
        yield Call("checkpoint_create", (agent,), body)


def put_writes_steps(
    codec: Codec, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
) -> Steps:
    agent = codec.agent(config["configurable"]["thread_id"])
    yield Call("event_emit", (agent, WRITES_EVENT, codec.writes_payload(config, writes, task_id, task_path)))
