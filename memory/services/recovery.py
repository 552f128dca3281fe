"""Crash recovery: the recovered state, everything an agent needs to resume, in one document.

`recovered_state` assembles several parts, each under a deadline: SQL statements run with
`statement_timeout` in a savepoint and the fold loop checks the clock, so a slow part is left out
with a warning instead of failing the whole. The parts come from the layers below: the fold of the
agent's events and its reducers (memory/services/state_fold.py, re-exported here), its cognitive state
and checkpoints (memory/services/cognition/) and its tasks and inbox (memory/services/layers.py).
Nothing below imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from memory.models import STATE_SCHEMA_VERSION, Agent, Checkpoint, Event, Message, Session, Tenant
from memory.services import cognition, layers, recorder
from memory.services.state_fold import (
    FOLD_VERSION,
    PartTimeout,
    Reducer,
    fold_apply,
    fold_cache_store,
    fold_event_rows,
    fold_events,
    fold_full,
    fold_initial,
    fold_start,
    fold_through,
    reducers_get,
    reducers_put,
    reducers_sha256,
)

FOLD_CACHE_MIN_EVENTS = 1000  # a recovery that folded at least this many events leaves its fold behind
STATEMENT_TIMEOUT_FLOOR_MS = 1000  # SQL statements of a part are cut at its deadline, but not sooner

__all__ = [  # the fold's names are part of the recovery capability's surface (API views, tests)
    "FOLD_VERSION",
    "EventsAfterCheckpoint",
    "RecoveredCheckpoint",
    "RecoveredSession",
    "RecoveredState",
    "Reducer",
    "fold_apply",
    "fold_cache_store",
    "fold_events",
    "fold_full",
    "fold_initial",
    "fold_through",
    "recovered_state",
    "reducers_get",
    "reducers_put",
    "reducers_sha256",
]

# --- the recovered state -----------------------------------------------------------------------


@dataclass
class RecoveredCheckpoint:
    checkpoint: Checkpoint
    schema_version: int  # of `state`: upgraded to this server's, or the checkpoint's when left out
    state: dict[str, Any] | None  # None when the checkpoint's schema_version is newer than ours


@dataclass
class RecoveredSession:
    session: Session
    messages: list[Message]  # the newest CTXAPP_RECOVERY_HISTORY_MESSAGES, oldest first


@dataclass
class EventsAfterCheckpoint:
    after_seq: int
    truncated: bool
    items: list[Event]


@dataclass
class RecoveredState:
    """The recovered state's parts as models and dataclasses; memory/api/shapes.py renders the
    document (`recovered_state_out`). A part that missed its deadline is None (see `warnings`)."""

    agent: Agent
    generated_at: datetime
    operational: dict[str, Any] | None
    checkpoint: RecoveredCheckpoint | None
    state: cognition.StateView | None
    session: RecoveredSession | None
    tasks: list[dict[str, Any]] | None
    events_after_checkpoint: EventsAfterCheckpoint | None
    inbox: list[dict[str, Any]] | None
    warnings: list[dict[str, Any]]
    parts: dict[str, Any]


def _run_part(
    name: str,
    func: Callable[[float], Any],
    *,
    timeout_ms: int,
    slow: float,
    warnings: list[dict[str, Any]],
    timings: dict[str, Any],
) -> Any:
    started = time.monotonic()
    deadline = started + timeout_ms / 1000
    result = None
    try:
        with transaction.atomic():  # a savepoint: a cancelled statement rolls back only this part
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('statement_timeout')")
                previous = cursor.fetchone()[0]
                statement_ms = max(timeout_ms, STATEMENT_TIMEOUT_FLOOR_MS)
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [str(statement_ms)])
                if slow:
                    cursor.execute("SELECT pg_sleep(%s)", [slow])
            result = func(deadline)
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, true)", [previous])
        ok = True
    except (PartTimeout, DatabaseError) as exc:
        ok = False
        timed_out = isinstance(exc, PartTimeout) or "statement timeout" in str(exc) or "canceling" in str(exc)
        warnings.append(
            {
                "part": name,
                "code": "part_timeout" if timed_out else "part_failed",
                "message": (
                    f"The {name} part did not finish within {timeout_ms} ms and is left out."
                    if timed_out
                    else f"The {name} part failed and is left out: {exc.__class__.__name__}."
                ),
            }
        )
    timings[name] = {"ok": ok, "ms": round((time.monotonic() - started) * 1000, 2)}
    return result


def recovered_state(
    *,
    tenant: Tenant,
    agent: Agent,
    caller: Agent | None = None,
    timeout_ms: int | None = None,
    slow_parts: dict[str, float] | None = None,
    record: bool = True,
) -> RecoveredState:
    """Everything an agent needs to resume after a crash, as models and dataclasses
    (memory/api/shapes.py `recovered_state_out` renders them as one document).

    Parts: `operational` (the fold of all its events), `checkpoint` (the latest checkpoint's
    cognitive state, schema-checked), `state` (the current cognitive state, which may be newer than
    the checkpoint), `session` (the latest session and its recent messages), `tasks` (its open tasks
    with their shared context, and its private context and unread inbox only when `caller` is the
    agent itself), `events_after_checkpoint`. Each part runs under `timeout_ms`; a part that misses
    it is null and listed in `warnings`. `slow_parts` ({part: seconds}) delays parts, for tests.
    Records `agent.recovered` unless `record` is false (an operator inspecting, not an agent
    resuming); the recovered content itself is idempotent.
    """
    timeout = timeout_ms or settings.CTXAPP.recovery_part_timeout_ms
    slow = slow_parts or {}
    warnings: list[dict[str, Any]] = []
    timings: dict[str, Any] = {}
    is_self = caller is not None and caller.pk == agent.pk
    fold_work: dict[str, Any] = {}

    def part(name: str, func: Callable[[float], Any]) -> Any:
        return _run_part(
            name, func, timeout_ms=timeout, slow=slow.get(name, 0.0), warnings=warnings, timings=timings
        )

    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost:
            # One snapshot for every part: an event committed meanwhile must not show up in the
            # events list but not in the fold (READ COMMITTED would give each statement its own).
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        latest = cognition.checkpoint_latest(tenant=tenant, agent=agent)

        def operational(deadline: float) -> dict[str, Any]:
            reducers = reducers_get(tenant=tenant, agent=agent)
            sha = reducers_sha256(reducers)
            state, after = fold_start(tenant=tenant, agent=agent, reducers_sha=sha, through=None)
            before = state["event_count"]
            rows = fold_event_rows(tenant=tenant, agent=agent, after=after, through=None)
            try:
                return fold_events(state, rows, reducers, deadline)
            finally:
                # Even when the deadline cuts the fold, `state` is a valid fold of a prefix of the
                # stream: kept below, it lets the next recovery carry on from there.
                fold_work.update(sha=sha, events=state["event_count"] - before, fold=state)

        def checkpoint_part(deadline: float) -> RecoveredCheckpoint | None:
            if latest is None:
                return None
            if latest.schema_version > STATE_SCHEMA_VERSION:
                warnings.append(
                    {
                        "part": "checkpoint",
                        "code": "schema_version_unsupported",
                        "message": f"Checkpoint #{latest.seq} has schema_version {latest.schema_version};"
                        f" this server supports up to {STATE_SCHEMA_VERSION}. Its state is left out.",
                    }
                )
                return RecoveredCheckpoint(latest, latest.schema_version, None)
            return RecoveredCheckpoint(
                latest, STATE_SCHEMA_VERSION, cognition.checkpoint_state(checkpoint=latest)
            )

        def state_part(deadline: float) -> cognition.StateView:
            return cognition.state_get(tenant=tenant, agent=agent)

        def session_part(deadline: float) -> RecoveredSession | None:
            session = (
                Session.objects.filter(tenant=tenant, agent=agent).order_by("-created_at", "-pk").first()
            )
            if session is None:
                return None
            limit = settings.CTXAPP.recovery_history_messages
            recent = list(Message.objects.filter(session=session).order_by("-seq")[:limit])
            recent.reverse()
            return RecoveredSession(session, recent)

        def tasks_part(deadline: float) -> list[dict[str, Any]]:
            return layers.tasks_open_for_agent(tenant=tenant, agent=agent, include_private=is_self)

        def events_part(deadline: float) -> EventsAfterCheckpoint:
            after = latest.covers_event_seq if latest is not None else 0
            limit = settings.CTXAPP.recovery_max_events
            queryset = Event.objects.filter(tenant=tenant, stream=recorder.stream_key(agent), seq__gt=after)
            rows = list(queryset.order_by("seq")[: limit + 1])
            return EventsAfterCheckpoint(after, len(rows) > limit, rows[:limit])

        result = RecoveredState(
            agent=agent,
            generated_at=timezone.now(),
            operational=part("operational", operational),
            checkpoint=part("checkpoint", checkpoint_part),
            state=part("state", state_part),
            session=part("session", session_part),
            tasks=part("tasks", tasks_part),
            events_after_checkpoint=part("events", events_part),
            inbox=None,
            warnings=warnings,
            parts=timings,
        )
        if is_self:
            result.inbox = part(
                "inbox", lambda deadline: layers.ipc_unread_for_agent(tenant=tenant, agent=agent)
            )
        else:
            warnings.append(
                {
                    "part": "private",
                    "code": "private_omitted",
                    "message": "Private context and inbox are only returned to the agent itself "
                    "(send X-Agent-Id naming it).",
                }
            )
    operational_state = result.operational
    if not record:
        return result
    with transaction.atomic():  # after the read-only snapshot: the event append takes a row lock
        if fold_work.get("events", 0) >= FOLD_CACHE_MIN_EVENTS:
            fold_cache_store(
                tenant=tenant, agent=agent, fold=fold_work["fold"], reducers_sha=fold_work["sha"]
            )
        recorder.event_append(
            tenant=tenant,
            type="agent.recovered",
            agent=agent,
            payload={
                "checkpoint_seq": latest.seq if latest is not None else None,
                "last_event_seq": operational_state["last_event_seq"] if operational_state else None,
                "warnings": [w["code"] for w in warnings],
            },
        )
    return result
