"""The agent page's recovered-state panel: what the agent would recover from right now, read
from the recovery service's result (a summary to read first, and the parts as data)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from dashboard.timeline import event_summary
from memory.models import Agent, Tenant
from memory.services.recovery import RecoveredState, recovered_state


def agent_recovered_state(*, tenant: Tenant, agent: Agent) -> Any:
    """What the agent would recover from right now (recovery.recovered_state): a summary to read
    first, and the parts as data, read from the service's own result.

    `recovered_state` records an `agent.recovered` event; the dashboard only previews it, so the
    call runs in a transaction that is rolled back: nothing is recorded or broadcast.
    """
    with transaction.atomic():
        result = recovered_state(tenant=tenant, agent=agent)
        transaction.set_rollback(True)
    last_event_seq = (result.operational or {}).get("last_event_seq")
    if not (result.checkpoint or result.session or result.tasks or last_event_seq):
        return None
    return {"summary": recovered_summary(result), "document": _recovered_parts(result)}


RECOVERED_EVENTS_SHOWN = 5


def recovered_summary(result: RecoveredState) -> dict[str, Any]:
    """What a person reads first of a recovered state: the goal, the last checkpoint, the open
    tasks and the latest events (the parts themselves stay one click away)."""
    checkpoint = result.checkpoint
    events = result.events_after_checkpoint.items if result.events_after_checkpoint else []
    return {
        "goal": _goal(
            result.state.document if result.state else None, checkpoint.state if checkpoint else None
        ),
        "checkpoint": {
            "seq": checkpoint.checkpoint.seq,
            "reason": checkpoint.checkpoint.reason,
            "created_at": checkpoint.checkpoint.created_at,
        }
        if checkpoint
        else None,
        "tasks": [
            {"title": t.get("title") or t.get("id"), "status": t.get("status", "")}
            for t in result.tasks or []
        ],
        "events": [
            {"type": event.type, "line": event_summary(event.type, event.payload)}
            for event in events[-RECOVERED_EVENTS_SHOWN:]
        ],
        "events_total": len(events),
        "warnings": [w.get("message", "") for w in result.warnings if isinstance(w, dict)],
    }


def _recovered_parts(result: RecoveredState) -> dict[str, Any]:
    """The recovered parts as JSON data: what the agent folds, holds and was doing."""
    session = result.session
    return {
        "operational": result.operational,
        "state": result.state.document if result.state else None,
        "checkpoint": None
        if result.checkpoint is None
        else {"seq": result.checkpoint.checkpoint.seq, "state": result.checkpoint.state},
        "session": None
        if session is None
        else {
            "id": session.session.public_id,
            "messages": [{"seq": m.seq, "role": m.role, "content": m.content} for m in session.messages],
        },
        "tasks": result.tasks,
        "inbox": result.inbox,
        "warnings": result.warnings,
    }


def _goal(*states: Any) -> str:
    """The goal of the newest cognitive state that has one (`context.goal`)."""
    for state in states:
        goal = ((state or {}).get("context") or {}).get("goal") if isinstance(state, dict) else None
        if goal:
            return str(goal)
    return ""
