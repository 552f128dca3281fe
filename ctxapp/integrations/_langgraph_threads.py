"""Whole-thread operations of the LangGraph checkpointer (copy_thread, prune, delete_for_runs),
sans-IO like _langgraph_core.py, whose steps and codec they use.

ctxapp keeps a thread's checkpoints as a delta chain and its writes as events, neither edited in
place: these operations read the thread, then write the part that stays into a new agent (the
thread deleted first when it is rewritten in place). Not atomic: a concurrent run on a thread
being pruned can lose what it writes meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ctxapp.client import NotFound
from ctxapp.integrations._langgraph_core import (
    THREAD_EVENT,
    WRITES_EVENT,
    Blobs,
    Call,
    Codec,
    Steps,
    all_checkpoints,
    all_writes,
    blob_refs,
    blobs_fetch,
    blobs_forget,
    delete_thread_steps,
    is_langgraph_checkpoint,
    thread_agents,
)


@dataclass
class _Stored:
    """A thread as stored: each checkpoint's row and state, oldest first, its writes, and the
    blobs they refer to."""

    checkpoints: list[tuple[dict[str, Any], dict[str, Any]]]
    writes: list[dict[str, Any]]
    blobs: Blobs

    def refs(self) -> set[str]:
        found = {ref for _, state in self.checkpoints for ref in blob_refs(_document(state))}
        return found | {ref for payload in self.writes for ref in blob_refs(payload)}


def _thread_read(agent: str) -> Steps:
    rows = sorted((yield from all_checkpoints(agent)), key=lambda row: row["seq"])
    checkpoints = []
    for row in rows:
        if is_langgraph_checkpoint(row):
            checkpoints.append((row, (yield Call("checkpoint_get", (agent, row["seq"])))["state"]))
    stored = _Stored(checkpoints, (yield from all_writes(agent)), {})
    yield from blobs_fetch(agent, stored.refs(), stored.blobs)
    return stored


def _document(state: dict[str, Any]) -> dict[str, Any]:
    document: dict[str, Any] = state["working_memory"]["langgraph"]
    return document


def _thread_write(agent: str, stored: _Stored, thread_id: str | None = None) -> Steps:
    """Write `stored` to the agent (as thread `thread_id` when given), the agent created by the
    thread's first event as in `put`."""
    if not stored.checkpoints:
        return
    named = thread_id if thread_id is not None else _document(stored.checkpoints[0][1])["thread_id"]
    yield Call("event_emit", (agent, THREAD_EVENT, {"thread_id": named}))
    for digest in sorted(stored.refs()):
        yield Call("blob_put", (agent, digest, stored.blobs[digest]))
    for row, state in stored.checkpoints:
        if thread_id is not None:
            state = {**state, "working_memory": {"langgraph": {**_document(state), "thread_id": thread_id}}}
        body = {"reason": row["reason"], "step": row.get("step"), "produced_by": row["produced_by"]}
        yield Call("checkpoint_create", (agent,), {**body, "state": state})
    for payload in stored.writes:
        yield Call("event_emit", (agent, WRITES_EVENT, payload))


def _keeping(stored: _Stored, keep: set[tuple[str, str]]) -> _Stored:
    """The checkpoints whose (namespace, checkpoint id) is in `keep`, with their writes only."""
    return _Stored(
        [(row, state) for row, state in stored.checkpoints if _key(_document(state)) in keep],
        [payload for payload in stored.writes if _key(payload) in keep],
        stored.blobs,
    )


def _key(document: dict[str, Any]) -> tuple[str, str]:
    return (document.get("checkpoint_ns", ""), document.get("checkpoint_id", ""))


def _thread_rewrite(
    agent: str, stored: _Stored, keep: set[tuple[str, str]], forget: tuple[str, set[str]]
) -> Steps:
    """Keep only `keep` of the stored thread (nothing left: the thread is deleted). `forget`:
    the thread's agent id and the saver's `known`, which no longer holds what it held."""
    if keep == {_key(_document(state)) for _, state in stored.checkpoints}:
        return
    blobs_forget(*forget)
    try:
        yield Call("agent_delete", (agent,))
    except NotFound:
        return
    yield from _thread_write(agent, _keeping(stored, keep))


def copy_thread_steps(codec: Codec, source: Any, target: Any) -> Steps:
    """Every checkpoint and write of `source` into `target`, checkpoint ids kept."""
    stored = yield from _thread_read(codec.agent(source))
    yield from _thread_write(codec.agent(target), stored, thread_id=str(target))


def prune_steps(codec: Codec, thread_ids: Sequence[Any], strategy: str, known: set[str]) -> Steps:
    """`keep_latest`: only the newest checkpoint of each namespace stays (with its writes);
    `delete`: the threads are deleted."""
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"Unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'.")
    for thread_id in thread_ids:
        if strategy == "delete":
            yield from delete_thread_steps(codec, thread_id, known)
            continue
        agent = codec.agent(thread_id)
        stored = yield from _thread_read(agent)
        newest: dict[str, str] = {}
        for _, state in stored.checkpoints:
            ns, checkpoint_id = _key(_document(state))
            newest[ns] = max(newest.get(ns, ""), checkpoint_id)
        yield from _thread_rewrite(agent, stored, set(newest.items()), (codec.agent_id(thread_id), known))


def delete_for_runs_steps(codec: Codec, run_ids: Sequence[str], known: set[str]) -> Steps:
    """Remove, from every thread, the checkpoints whose metadata `run_id` is one of `run_ids`,
    with their writes."""
    doomed = {str(run_id) for run_id in run_ids}
    if not doomed:
        return
    for agent in (yield from thread_agents(codec)):
        stored = yield from _thread_read(agent)
        keep = {
            _key(_document(state))
            for _, state in stored.checkpoints
            if str(codec.unpack(_document(state)["metadata"], stored.blobs).get("run_id")) not in doomed
        }
        yield from _thread_rewrite(agent, stored, keep, (unquote(agent), known))
