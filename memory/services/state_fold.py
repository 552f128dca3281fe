"""The fold: an agent's events folded into its operational state, and the reducers it declared.

The fold is deterministic and pure: `fold_apply(state, event, reducers)` looks only at its
arguments; nothing is re-executed. docs/cognition.md has THE FOLD TABLE (which event type changes
which part of the state). Each checkpoint stores the fold up to its own event (checkpoint_create
calls `fold_through`), so recovery folds only the events after the latest checkpoint (when the
agent's reducers are still the same).

Below cognition and recovery: it imports neither (memory/services/recovery.py assembles the
recovered state from this fold, the cognitive state and the task layers).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from django.db import transaction
from django.db.models import Q

from memory.models import Agent, AgentReducer, Checkpoint, CognitiveState, Event, Tenant, empty_state
from memory.services import recorder

FOLD_VERSION = 1
MAX_FOLD_ERRORS = 20
FOLD_CHUNK = 2000
FOLD_MIN_PROGRESS = 1000  # events a fold gets through before it looks at its deadline

# --- reducers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reducer:
    event_type: str
    op: str  # set | merge | append
    target: str  # dotted path in the custom state
    source: str = ""  # dotted path in the payload; "" = the whole payload


def reducers_get(*, tenant: Tenant, agent: Agent) -> list[Reducer]:
    """The agent's declared reducers, in order. Read-only."""
    return [
        Reducer(r.event_type, r.op, r.target, r.source)
        for r in AgentReducer.objects.filter(tenant=tenant, agent=agent).order_by("position")
    ]


def reducers_sha256(reducers: list[Reducer]) -> str:
    text = json.dumps([FOLD_VERSION, [asdict(r) for r in reducers]], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@transaction.atomic
def reducers_put(*, tenant: Tenant, agent: Agent, reducers: list[Reducer]) -> list[Reducer]:
    """Replace the agent's reducers, validated by the caller (the API's input serializer: `agent.*`
    event types, ops set / merge / append, dotted paths). Idempotent. Records `reducers.updated`.
    A change of reducers makes the next recovery fold the whole stream.
    """
    parsed = list(reducers)
    AgentReducer.objects.filter(agent=agent).delete()
    AgentReducer.objects.bulk_create(
        AgentReducer(
            tenant=tenant,
            agent=agent,
            position=i,
            event_type=r.event_type,
            op=r.op,
            target=r.target,
            source=r.source,
        )
        for i, r in enumerate(parsed)
    )
    recorder.event_append(
        tenant=tenant,
        type="reducers.updated",
        agent=agent,
        payload={"count": len(parsed), "reducers_sha256": reducers_sha256(parsed)},
    )
    return parsed


# --- the fold ----------------------------------------------------------------------------------


def fold_initial() -> dict[str, Any]:
    return {
        "fold_version": FOLD_VERSION,
        "last_event_seq": 0,
        "event_count": 0,
        "event_counts": {},
        "sessions": {"latest": None, "open": [], "created": 0},
        "messages": {"count": 0, "tokens": 0, "last_seq": {}},
        "tasks": {"open": [], "succeeded": 0, "failed": 0},
        "cognition": {"state_version": 0, "checkpoint": None, "checkpoints": 0, "restored_from": None},
        "recoveries": 0,
        "custom": {},
        "fold_errors": [],
    }


def _fold_error(state: dict[str, Any], seq: int, message: str) -> None:
    errors = state["fold_errors"]
    errors.append({"seq": seq, "error": message})
    del errors[:-MAX_FOLD_ERRORS]


def _payload_get(payload: Any, path: str) -> tuple[bool, Any]:
    if not path:  # the agent's own payload, without the ids the recorder adds
        return True, {k: v for k, v in payload.items() if not k.startswith("gen_ai.")}
    value = payload
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return False, None
    return True, value


def _apply_reducer(custom: dict[str, Any], reducer: Reducer, payload: Any) -> str | None:
    """Apply one reducer; return an error text instead of raising (the fold must go on)."""
    found, value = _payload_get(payload, reducer.source)
    if not found:
        return f"payload has no {reducer.source!r} for reducer {reducer.op} {reducer.target}"
    parts = reducer.target.split(".")
    parent = custom
    for part in parts[:-1]:
        child = parent.get(part)
        if child is None:
            child = parent[part] = {}
        if not isinstance(child, dict):
            return f"{reducer.target!r}: {part!r} is not an object"
        parent = child
    key = parts[-1]
    value = copy.deepcopy(value)
    if reducer.op == "set":
        parent[key] = value
    elif reducer.op == "merge":
        if not isinstance(value, dict):
            return f"merge into {reducer.target!r} needs an object"
        current = parent.get(key)
        if current is None:
            current = parent[key] = {}
        if not isinstance(current, dict):
            return f"{reducer.target!r} is not an object"
        current.update(value)
    else:
        current = parent.get(key)
        if current is None:
            current = parent[key] = []
        if not isinstance(current, list):
            return f"{reducer.target!r} is not a list"
        current.append(value)
    return None


def _remove(items: list[Any], value: Any) -> None:
    if value in items:
        items.remove(value)


def _task_id(payload: dict[str, Any]) -> Any:
    return payload.get("task") or payload.get("task_id") or payload.get("id")


def _fold_session(state: dict[str, Any], type: str, payload: dict[str, Any], session_id: Any) -> None:
    sessions = state["sessions"]
    if type == "session.created":
        sessions["latest"] = session_id
        sessions["created"] += 1
        if session_id and session_id not in sessions["open"]:
            sessions["open"].append(session_id)
    elif type == "retention.evicted":
        if payload.get("kind") == "session":
            for sid in payload.get("sessions", []) or [session_id]:
                _remove(sessions["open"], sid)
    else:  # ended, expired, evicted, deleted
        _remove(sessions["open"], session_id)


def _fold_message(state: dict[str, Any], type: str, payload: dict[str, Any], session_id: Any) -> None:
    messages = state["messages"]
    messages["count"] += 1
    messages["tokens"] += int(payload.get("tokens") or 0)
    if session_id and isinstance(payload.get("seq"), int):
        messages["last_seq"][session_id] = payload["seq"]


def _fold_task(state: dict[str, Any], type: str, payload: dict[str, Any], session_id: Any) -> None:
    task = _task_id(payload)
    if type == "task.created":
        if task and task not in state["tasks"]["open"]:
            state["tasks"]["open"].append(task)
        return
    _remove(state["tasks"]["open"], task)
    status = payload.get("status") or ("failed" if type == "task.failed" else "succeeded")
    key = "failed" if status == "failed" else "succeeded"
    state["tasks"][key] += 1


def _fold_cognition(state: dict[str, Any], type: str, payload: dict[str, Any], session_id: Any) -> None:
    cognition = state["cognition"]
    if type == "checkpoint.created":
        cognition["checkpoint"] = {"id": payload.get("checkpoint"), "seq": payload.get("seq")}
        cognition["checkpoints"] += 1
        if payload.get("state_version") is not None:
            cognition["state_version"] = payload["state_version"]
        return
    cognition["state_version"] = payload.get("version", cognition["state_version"])
    if type == "state.restored":
        restored_from = {"checkpoint": payload.get("from_checkpoint"), "seq": payload.get("from_seq")}
        cognition["restored_from"] = restored_from


def _fold_recovered(state: dict[str, Any], type: str, payload: dict[str, Any], session_id: Any) -> None:
    state["recoveries"] += 1


# Which part of the fold each built-in event type changes (THE FOLD TABLE in docs/cognition.md).
_FOLD_STEPS: dict[str, Callable[[dict[str, Any], str, dict[str, Any], Any], None]] = {
    "session.created": _fold_session,
    "session.ended": _fold_session,
    "session.expired": _fold_session,
    "session.evicted": _fold_session,
    "session.deleted": _fold_session,
    "retention.evicted": _fold_session,
    "message.added": _fold_message,
    "task.created": _fold_task,
    "task.completed": _fold_task,
    "task.failed": _fold_task,
    "task.succeeded": _fold_task,
    "state.updated": _fold_cognition,
    "state.restored": _fold_cognition,
    "checkpoint.created": _fold_cognition,
    "agent.recovered": _fold_recovered,
}


def fold_apply(
    state: dict[str, Any], seq: int, type: str, payload: dict[str, Any], reducers: list[Reducer]
) -> None:
    """Fold one event into `state` (in place). Deterministic; looks only at its arguments."""
    state["last_event_seq"] = seq
    state["event_count"] += 1
    counts = state["event_counts"]
    counts[type] = counts.get(type, 0) + 1
    step = _FOLD_STEPS.get(type)
    if step is not None:
        step(state, type, payload, payload.get("gen_ai.conversation.id"))
    if type.startswith("agent.") and type != "agent.recovered":
        for reducer in reducers:
            if reducer.event_type == type:
                error = _apply_reducer(state["custom"], reducer, payload)
                if error:
                    _fold_error(state, seq, error)


class PartTimeout(Exception):
    pass


def fold_event_rows(
    *, tenant: Tenant, agent: Agent, after: int, through: int | None
) -> Iterable[tuple[int, str, Any]]:
    queryset = Event.objects.filter(tenant=tenant, stream=recorder.stream_key(agent), seq__gt=after)
    if through is not None:
        queryset = queryset.filter(seq__lte=through)
    # keyset chunks: a server-side cursor would not survive the savepoints recovery uses
    last = after
    while True:
        chunk = list(
            queryset.filter(seq__gt=last).order_by("seq").values_list("seq", "type", "payload")[:FOLD_CHUNK]
        )
        yield from chunk
        if len(chunk) < FOLD_CHUNK:
            return
        last = chunk[-1][0]


def fold_events(
    state: dict[str, Any],
    rows: Iterable[tuple[int, str, Any]],
    reducers: list[Reducer],
    deadline: float | None = None,
) -> dict[str, Any]:
    """Fold `rows` (seq, type, payload) into `state` in place and return it. Pure but for the clock.

    With a `deadline`, raises PartTimeout once it is past (checked every 1,000 events, after at
    least FOLD_MIN_PROGRESS); `state` is then a valid fold of the rows before that point.
    """
    for index, (seq, type, payload) in enumerate(rows):
        if (
            deadline is not None
            and index >= FOLD_MIN_PROGRESS
            and index % 1000 == 0
            and time.monotonic() > deadline
        ):
            raise PartTimeout()
        fold_apply(state, seq, type, payload if isinstance(payload, dict) else {}, reducers)
    return state


def fold_start(
    *, tenant: Tenant, agent: Agent, reducers_sha: str, through: int | None
) -> tuple[dict[str, Any], int]:
    """The newest stored fold (on a checkpoint or the state row) usable as a start, or the empty fold."""
    queryset = Checkpoint.objects.filter(tenant=tenant, agent=agent, reducers_sha256=reducers_sha).exclude(
        fold_state=""
    )
    cached = CognitiveState.objects.filter(
        tenant=tenant, agent=agent, fold_reducers_sha256=reducers_sha
    ).exclude(fold_state="")
    if through is not None:
        queryset = queryset.filter(covers_event_seq__lte=through)
        cached = cached.filter(fold_seq__lte=through)
    # Both candidates in one round trip (checkpoint_create runs this on every checkpoint).
    newest = queryset.order_by("-covers_event_seq").values_list("covers_event_seq", "fold_state")[:1]
    candidates = list(newest.union(cached.values_list("fold_seq", "fold_state")[:1], all=True))
    if not candidates:
        return fold_initial(), 0
    seq, text = max(candidates, key=lambda row: row[0])
    return json.loads(text), int(seq)


def fold_cache_store(*, tenant: Tenant, agent: Agent, fold: dict[str, Any], reducers_sha: str) -> bool:
    """Keep `fold` on the agent's state row if it is newer than the one there. Idempotent.

    Run by recovery after folding many events, so the next recovery of an agent that rarely
    checkpoints does not fold them again. Returns whether it stored.
    """
    seq = int(fold["last_event_seq"])
    CognitiveState.objects.get_or_create(
        agent=agent, defaults={"tenant": tenant, "document": json.dumps(empty_state())}
    )
    updated = (
        CognitiveState.objects.filter(tenant=tenant, agent=agent)
        .filter(Q(fold_seq__lt=seq) | ~Q(fold_reducers_sha256=reducers_sha))
        .update(
            fold_state=json.dumps(fold, separators=(",", ":")),
            fold_seq=seq,
            fold_reducers_sha256=reducers_sha,
        )
    )
    return bool(updated)


def fold_through(
    *, tenant: Tenant, agent: Agent, through_seq: int | None = None
) -> tuple[dict[str, Any], str]:
    """The fold of the agent's events up to `through_seq` (all when None), and its reducers' hash."""
    reducers = reducers_get(tenant=tenant, agent=agent)
    sha = reducers_sha256(reducers)
    state, after = fold_start(tenant=tenant, agent=agent, reducers_sha=sha, through=through_seq)
    rows = fold_event_rows(tenant=tenant, agent=agent, after=after, through=through_seq)
    return fold_events(state, rows, reducers), sha


def fold_full(*, tenant: Tenant, agent: Agent) -> dict[str, Any]:
    """The fold of the whole stream from seq 1, ignoring stored folds (for checks and tests)."""
    reducers = reducers_get(tenant=tenant, agent=agent)
    return fold_events(
        fold_initial(), fold_event_rows(tenant=tenant, agent=agent, after=0, through=None), reducers
    )
