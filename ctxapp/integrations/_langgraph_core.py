"""The sans-IO core of the LangGraph checkpointer (langgraph.py): how LangGraph objects are kept
in ctxapp (`Codec`), which checkpoints answer a query, and each saver operation as a generator of
client calls (`Call`), which the sync and async drivers in langgraph.py carry out. No I/O here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

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
AGENT_ID_MAX = 200
PAGE = 1000
# How much of its values a checkpoint state and a writes event carry inline (packed JSON bytes);
# the rest, largest first, goes to blobs they reference. Under the server's defaults
# (CTXAPP_STATE_MAX_BYTES 4 MiB, CTXAPP_EVENT_PAYLOAD_MAX_BYTES 256 KiB), with room for the rest
# of the document; a value inline stays readable on the dashboard and is stored as a delta.
CHECKPOINT_INLINE_BYTES = 3 * 1024 * 1024
VALUE_INLINE_BYTES = 1024 * 1024
WRITES_INLINE_BYTES = 160 * 1024

Blobs = dict[str, bytes]  # by SHA-256 (hex)
PackedWrite = tuple[str, str, dict[str, Any]]  # (task id, channel, the value as stored)


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


def segment(agent_id: str) -> str:
    """An agent id as one URL path segment."""
    return quote(agent_id, safe="")


def _reason(checkpoint_ns: str) -> str:
    return (f"{REASON} {checkpoint_ns}" if checkpoint_ns else REASON)[:REASON_MAX]


class Codec:
    """Pure encoding between LangGraph objects and the JSON kept in ctxapp (no I/O)."""

    def __init__(self, serde: SerializerProtocol, agent_prefix: str) -> None:
        self.serde = serde
        self.agent_prefix = agent_prefix

    def agent_id(self, thread_id: Any) -> str:
        """The thread's agent id: the prefix and the thread id as given, but for the characters an
        agent id cannot hold ('/', control characters) and '%', percent-encoded."""
        text = str(thread_id)
        name = self.agent_prefix + "".join(
            c if c.isprintable() and c not in "/%" else quote(c, safe="") for c in text
        )
        if len(name) <= AGENT_ID_MAX:  # longer: cut, and told apart by a digest of the whole id
            return name
        return name[: AGENT_ID_MAX - 17] + "~" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def agent(self, thread_id: Any) -> str:
        """The thread's agent as a URL path segment."""
        return segment(self.agent_id(thread_id))

    def pack(self, value: Any) -> dict[str, Any]:
        if _plain(value):
            return {"json": value}
        kind, data = self.serde.dumps_typed(value)
        return {"type": kind, "b64": base64.b64encode(data).decode()}

    def unpack(self, packed: dict[str, Any], blobs: Blobs | None = None) -> Any:
        if "json" in packed:
            return packed["json"]
        if "blob" in packed:
            return self.serde.loads_typed((packed["type"], (blobs or {})[packed["blob"]]))
        return self.serde.loads_typed((packed["type"], base64.b64decode(packed["b64"])))

    def spill(
        self, packed: dict[Any, dict[str, Any]], values: dict[Any, Any], *, budget: int, each: int
    ) -> Blobs:
        """Move values out of `packed` into blobs, largest first, until what stays inline is within
        `budget` bytes and no value over `each`: each moved one becomes a reference (its serde
        type, the blob's SHA-256 and size). Returns the blobs to store. `values`: the originals."""
        sizes = {key: len(json.dumps(item, ensure_ascii=False)) for key, item in packed.items()}
        total = sum(sizes.values())
        blobs: Blobs = {}
        for key in sorted(sizes, key=lambda k: sizes[k], reverse=True):
            if total <= budget and sizes[key] <= each:
                break
            item = packed[key]
            kind, data = (
                self.serde.dumps_typed(values[key])
                if "json" in item
                else (item["type"], base64.b64decode(item["b64"]))
            )
            digest = hashlib.sha256(data).hexdigest()
            blobs[digest] = data
            packed[key] = {"type": kind, "blob": digest, "size": len(data)}
            total -= sizes[key]
        return blobs

    def state(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> tuple[dict[str, Any], Blobs]:
        """The checkpoint as a ctxapp state document, and the blobs its large values went to."""
        configurable = config["configurable"]
        rest = {key: value for key, value in checkpoint.items() if key != "channel_values"}
        values: dict[Any, Any] = {
            ("channel", key): value for key, value in checkpoint["channel_values"].items()
        }
        values |= {"checkpoint": rest, "metadata": get_checkpoint_metadata(config, metadata)}
        packed = {key: self.pack(value) for key, value in values.items()}
        blobs = self.spill(packed, values, budget=CHECKPOINT_INLINE_BYTES, each=VALUE_INLINE_BYTES)
        document = {
            "thread_id": str(configurable["thread_id"]),
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": configurable.get("checkpoint_id"),
            "checkpoint": packed["checkpoint"],
            "channel_values": {key: packed[("channel", key)] for key in checkpoint["channel_values"]},
            "metadata": packed["metadata"],
        }
        return {"schema_version": 1, "working_memory": {"langgraph": document}}, blobs

    def checkpoint_tuple(
        self,
        state: dict[str, Any],
        writes_index: dict[tuple[str, str], list[PackedWrite]],
        blobs: Blobs | None = None,
    ) -> CheckpointTuple:
        document = state["working_memory"]["langgraph"]
        thread_id, checkpoint_ns = document["thread_id"], document["checkpoint_ns"]
        writes = self.pending_writes(writes_index.get((checkpoint_ns, document["checkpoint_id"]), []), blobs)
        checkpoint = self.unpack(document["checkpoint"], blobs)
        checkpoint["channel_values"] = {
            key: self.unpack(value, blobs) for key, value in document["channel_values"].items()
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
            metadata=self.unpack(document["metadata"], blobs),
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
    ) -> tuple[str, dict[str, Any], Blobs]:
        """(agent, keyword arguments of Client.checkpoint_create, blobs to store first) for one `put`."""
        state, blobs = self.state(config, checkpoint, metadata)
        step = metadata.get("step")
        body: dict[str, Any] = {
            "reason": _reason(state["working_memory"]["langgraph"]["checkpoint_ns"]),
            "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "produced_by": checkpoint["id"],
            "state": state,
        }
        return self.agent(config["configurable"]["thread_id"]), body, blobs

    def writes_payload(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> tuple[dict[str, Any], Blobs]:
        """A writes event's payload, and the blobs its large values went to."""
        configurable = config["configurable"]
        values = {index: value for index, (_, value) in enumerate(writes)}
        packed = {index: self.pack(value) for index, value in values.items()}
        blobs = self.spill(packed, values, budget=WRITES_INLINE_BYTES, each=WRITES_INLINE_BYTES)
        payload = {
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            "checkpoint_id": configurable["checkpoint_id"],
            "task_id": task_id,
            "task_path": task_path,
            "writes": [
                [WRITES_IDX_MAP.get(channel, index), channel, packed[index]]
                for index, (channel, _) in enumerate(writes)
            ],
        }
        return payload, blobs

    def writes_index(self, payloads: list[dict[str, Any]]) -> dict[tuple[str, str], list[PackedWrite]]:
        """Pending writes per (namespace, checkpoint id), still packed (see `pending_writes`), from
        the payloads of `agent.langgraph.writes` events in stream order: a regular write is kept
        once per (task, index), a special one replaced."""
        stored: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Any, str]]] = {}
        for payload in payloads:
            key = (payload.get("checkpoint_ns", ""), payload.get("checkpoint_id", ""))
            bucket = stored.setdefault(key, {})
            for index, channel, value in payload.get("writes", []):
                inner = (payload["task_id"], int(index))
                if inner[1] >= 0 and inner in bucket:
                    continue
                bucket[inner] = (payload["task_id"], channel, value, payload.get("task_path", ""))
        return {
            key: [
                (task_id, channel, value)
                for (task_id, channel, value, _path) in (
                    bucket[inner] for inner in sorted(bucket, key=lambda k: writes_sort_key(bucket[k][3], *k))
                )
            ]
            for key, bucket in stored.items()
        }

    def pending_writes(self, packed: list[PackedWrite], blobs: Blobs | None = None) -> list[PendingWrite]:
        return [(task_id, channel, self.unpack(value, blobs)) for task_id, channel, value in packed]


def blob_refs(document: dict[str, Any]) -> set[str]:
    """The blobs a saver's state document or writes payload refers to."""
    packed: list[Any] = [document.get("checkpoint"), document.get("metadata")]
    packed += list((document.get("channel_values") or {}).values())
    packed += [write[2] for write in document.get("writes") or [] if len(write) > 2]
    return {item["blob"] for item in packed if isinstance(item, dict) and "blob" in item}


def _matches(item: dict[str, Any], checkpoint_ns: str | None) -> bool:
    """Could this checkpoint (metadata only) be in `checkpoint_ns` (None: any)? The reason may be
    truncated, so a long namespace is confirmed from the state."""
    reason = item.get("reason") or ""
    if not (reason == REASON or reason.startswith(REASON + " ")):
        return False
    return checkpoint_ns is None or reason == _reason(checkpoint_ns)


def is_langgraph_checkpoint(item: dict[str, Any]) -> bool:
    """Was this checkpoint (metadata only) put by the saver, in any namespace?"""
    return _matches(item, None)


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


def all_checkpoints(agent: str) -> Steps:
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


def _blob_key(agent_id: str, digest: str) -> str:
    """How `known` remembers that the agent holds a blob (beside the agent ids it holds)."""
    return f"blob:{agent_id}:{digest}"


def blobs_forget(agent_id: str, known: set[str]) -> None:
    """Forget what the agent was known to hold (it was deleted, or rewritten)."""
    known.discard(agent_id)
    known.difference_update({key for key in known if key.startswith(f"blob:{agent_id}:")})


def blobs_store(agent: str, agent_id: str, blobs: Blobs, known: set[str]) -> Steps:
    """Store the blobs the agent is not known to hold (the same bytes again would store nothing,
    but would be sent again: a large value unchanged from step to step is sent once)."""
    for digest, data in blobs.items():
        if _blob_key(agent_id, digest) not in known:
            yield Call("blob_put", (agent, digest, data))
            known.add(_blob_key(agent_id, digest))


def blobs_fetch(agent: str, refs: set[str], blobs: Blobs) -> Steps:
    """Read into `blobs` those of `refs` it lacks."""
    for digest in sorted(refs - blobs.keys()):
        blobs[digest] = yield Call("blob_get", (agent, digest))


def all_writes(agent: str) -> Steps:
    """The payloads of every writes event of the agent, in stream order."""
    payloads: list[dict[str, Any]] = []
    cursor: int | None = 0
    try:
        while cursor is not None:
            page = yield Call("events_list", (agent,), {"after": cursor, "limit": PAGE, "type": WRITES_EVENT})
            payloads.extend(event.get("payload") or {} for event in page["items"])
            cursor = page["next_after"] if page["items"] else None
    except NotFound:
        return []
    return payloads


def _thread_exists(codec: Codec, thread_id: Any, known: set[str]) -> Steps:
    """Does the thread's agent exist? Asked once per saver and agent (a lookup that answers an
    empty page rather than 404 for a thread not yet written)."""
    agent_id = codec.agent_id(thread_id)
    if agent_id in known:
        return True
    page = yield Call("agents_list", (), {"name": agent_id, "limit": 1})
    if page["items"]:
        known.add(agent_id)
        return True
    return False


def thread_agents(codec: Codec) -> Steps:
    """The URL segments of every thread's agent (the agents whose id starts with the prefix)."""
    agents: list[str] = []
    cursor = None
    while True:
        page = yield Call("agents_list", (), {"prefix": codec.agent_prefix, "cursor": cursor, "limit": PAGE})
        agents.extend(segment(agent["name"]) for agent in page["items"])
        cursor = page["next"]
        if not cursor:
            return agents


def _agent_tuples(
    codec: Codec,
    agent: str,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    *,
    before: str | None,
    filter: dict[str, Any] | None,
    limit: int | None,
) -> Steps:
    """The agent's checkpoints that match, newest first, as CheckpointTuples (at most `limit`);
    returns how many it yielded."""
    rows = _candidates(
        (yield from all_checkpoints(agent)),
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        before=before,
    )
    index: dict[tuple[str, str], list[PackedWrite]] | None = None
    blobs: Blobs = {}
    count = 0
    for row in rows:
        if limit is not None and count >= limit:
            break
        state = (yield Call("checkpoint_get", (agent, row["seq"])))["state"]
        document = state["working_memory"]["langgraph"]
        if checkpoint_ns is not None and document["checkpoint_ns"] != checkpoint_ns:
            continue
        yield from blobs_fetch(agent, blob_refs({"metadata": document["metadata"]}), blobs)
        if not _filter_ok(codec.unpack(document["metadata"], blobs), filter):
            continue
        if index is None:
            index = codec.writes_index((yield from all_writes(agent)))
        writes = index.get((document["checkpoint_ns"], document["checkpoint_id"]), [])
        yield from blobs_fetch(agent, blob_refs(document) | blob_refs({"writes": writes}), blobs)
        yield codec.checkpoint_tuple(state, index, blobs)
        count += 1
    return count


def tuples_steps(
    codec: Codec,
    thread_id: Any,
    checkpoint_ns: str | None,
    checkpoint_id: str | None,
    *,
    before: str | None,
    filter: dict[str, Any] | None,
    limit: int | None,
    known: set[str],
) -> Steps:
    """The checkpoints that match, newest first, as CheckpointTuples (at most `limit`): of one
    thread, or (thread_id None) of every thread, one thread after another."""
    if limit is not None and limit <= 0:
        return
    if thread_id is None:
        agents = yield from thread_agents(codec)
    elif (yield from _thread_exists(codec, thread_id, known)):
        agents = [codec.agent(thread_id)]
    else:
        agents = []
    for agent in agents:
        found = yield from _agent_tuples(
            codec, agent, checkpoint_ns, checkpoint_id, before=before, filter=filter, limit=limit
        )
        if limit is not None:
            limit -= found
            if limit <= 0:
                return


def put_steps(
    codec: Codec,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    known: set[str],
) -> Steps:
    """One checkpoint, its large values stored first as blobs it refers to. Before the first of a
    thread this saver has not seen, an event creates the thread's agent if it does not exist yet
    (an event's POST creates its agent; a checkpoint's does not), so no request fails."""
    agent, body, blobs = codec.checkpoint_body(config, checkpoint, metadata)
    thread_id = config["configurable"]["thread_id"]
    agent_id = codec.agent_id(thread_id)
    created = Call("event_emit", (agent, THREAD_EVENT, {"thread_id": str(thread_id)}))
    if agent_id not in known:
        yield created
        known.add(agent_id)
    try:
        yield from blobs_store(agent, agent_id, blobs, known)
        yield Call("checkpoint_create", (agent,), body)
    except NotFound:  # the thread was deleted elsewhere since this saver saw it
        blobs_forget(agent_id, known)
        yield created
        known.add(agent_id)
        yield from blobs_store(agent, agent_id, blobs, known)
        yield Call("checkpoint_create", (agent,), body)


def put_writes_steps(
    codec: Codec,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
    known: set[str],
) -> Steps:
    """One writes event, its large values stored first as blobs it refers to."""
    thread_id = config["configurable"]["thread_id"]
    agent, agent_id = codec.agent(thread_id), codec.agent_id(thread_id)
    payload, blobs = codec.writes_payload(config, writes, task_id, task_path)
    try:
        yield from blobs_store(agent, agent_id, blobs, known)
    except NotFound:  # no such thread (yet, or any more): its event creates its agent
        blobs_forget(agent_id, known)
        yield Call("event_emit", (agent, THREAD_EVENT, {"thread_id": str(thread_id)}))
        yield from blobs_store(agent, agent_id, blobs, known)
    yield Call("event_emit", (agent, WRITES_EVENT, payload))


def delete_thread_steps(codec: Codec, thread_id: Any, known: set[str]) -> Steps:
    """Delete the thread's agent: its checkpoints, writes events and blobs with it."""
    blobs_forget(codec.agent_id(thread_id), known)
    try:
        yield Call("agent_delete", (codec.agent(thread_id),))
    except NotFound:
        return
