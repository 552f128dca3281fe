"""The live panels: one partial template and one context builder each.

A page view renders its panels with these builders, and the websocket consumer re-renders the
same partials with the same builders when events arrive (one template for the full page and
the live update alike). Builders are read-only and call selectors only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.template.loader import render_to_string

from dashboard import capabilities, charts, jobs, recovered, selectors, traces
from memory.models import Agent, Session, Tenant


@dataclass(frozen=True)
class Panel:
    template: str
    build: Callable[..., dict[str, Any]]
    # Event types (prefixes) that make this panel stale; "*" = any event of its scope.
    triggers: tuple[str, ...]


# --- overview -------------------------------------------------------------------------------


def _overview_stats(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    stats = selectors.overview_stats(tenant=tenant)
    return {
        "stats": stats,
        "sparkline": charts.sparkline(values=stats.messages_per_minute),
        "queues": jobs.queue_depths(),
        "outbox": jobs.outbox_waiting(tenant=tenant),
    }


def _overview_agents(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    return {"agents": selectors.agents_recent(tenant=tenant)}


def _overview_sessions(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    return {"sessions": selectors.sessions_open(tenant=tenant)}


def _overview_events(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    return {"events": selectors.events_recent(tenant=tenant)}


# --- session --------------------------------------------------------------------------------


def _session_header(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    session.refresh_from_db(
        fields=["status", "message_count", "token_count", "last_accessed_at", "message_seq"]
    )
    return {"session": session}


def _session_budget(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    return {"session": session, "budget": capabilities.session_budget(tenant=tenant, session=session)}


def _session_manifest(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    return {"session": session, "manifest": capabilities.session_manifest(tenant=tenant, session=session)}


def _session_summaries(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    return {"session": session, "summaries": capabilities.session_summaries(tenant=tenant, session=session)}


def _session_digest(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    return {"session": session, "digest": capabilities.session_digest(tenant=tenant, session=session)}


def _session_facts(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    return {"session": session, "facts": capabilities.session_facts(tenant=tenant, session=session)}


# --- agent ----------------------------------------------------------------------------------


def _agent_checkpoints(*, tenant: Tenant, agent: Agent, **_: Any) -> dict[str, Any]:
    return {"agent": agent, "checkpoints": capabilities.agent_checkpoints(tenant=tenant, agent=agent)}


def _agent_cognitive(*, tenant: Tenant, agent: Agent, **_: Any) -> dict[str, Any]:
    return {"agent": agent, "cognitive": capabilities.agent_cognitive_state(tenant=tenant, agent=agent)}


def _agent_recovered(*, tenant: Tenant, agent: Agent, **_: Any) -> dict[str, Any]:
    return {"agent": agent, "recovered": recovered.agent_recovered_state(tenant=tenant, agent=agent)}


def _agent_events(
    *, tenant: Tenant, agent: Agent, filters: selectors.EventFilter | None = None, **_: Any
) -> dict:
    filters = filters or selectors.EventFilter()
    return {
        "agent": agent,
        "filters": filters,
        "page": selectors.agent_events(tenant=tenant, agent=agent, filters=filters),
        "type_choices": selectors.event_type_choices(tenant=tenant, agent=agent),
        "filtered": bool(filters.type or filters.session or filters.before),
    }


# --- user -----------------------------------------------------------------------------------


def _user_memories(*, tenant: Tenant, user_id: str, **_: Any) -> dict[str, Any]:
    return {"user_id": user_id, "memories": selectors.user_memories(tenant=tenant, user_id=user_id)}


def _user_sessions(*, tenant: Tenant, user_id: str, **_: Any) -> dict[str, Any]:
    sessions, count = selectors.user_sessions(tenant=tenant, user_id=user_id)
    return {"user_id": user_id, "sessions": sessions, "session_count": count}


# --- experiences and jobs -------------------------------------------------------------------


def _experiences_recent(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    return {"recent": capabilities.experiences_recent(tenant=tenant)}


def _jobs_queues(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    return {
        "queues": jobs.queue_depths(),
        "progress": jobs.job_progress(tenant=tenant),
        "backlog": jobs.embedding_backlog(tenant=tenant),
    }


def _jobs_results(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    records = jobs.job_rows(tenant=tenant, records=jobs.job_records(tenant=tenant))
    return {"records": records, "results": jobs.job_results(tenant=tenant)}


def _jobs_failed(*, tenant: Tenant, **_: Any) -> dict[str, Any]:
    return {"failed": jobs.failed_jobs(tenant=tenant)}


P = "dashboard/partials/"
PANELS: dict[str, Panel] = {
    "overview-stats": Panel(P + "_overview_stats.html", _overview_stats, ("*",)),
    "overview-agents": Panel(P + "_overview_agents.html", _overview_agents, ("session.", "agent.")),
    "overview-sessions": Panel(P + "_overview_sessions.html", _overview_sessions, ("session.", "message.")),
    "overview-events": Panel(P + "_overview_events.html", _overview_events, ("*",)),
    "session-header": Panel(P + "_session_header.html", _session_header, ("message.", "session.")),
    "session-budget": Panel(
        P + "_session_budget.html", _session_budget, ("context.", "budget.", "summary.", "message.")
    ),
    "session-manifest": Panel(P + "_session_manifest.html", _session_manifest, ("context.",)),
    "session-summaries": Panel(P + "_session_summaries.html", _session_summaries, ("summary.", "context.")),
    "session-facts": Panel(P + "_session_facts.html", _session_facts, ("fact.", "context.", "message.")),
    "session-digest": Panel(P + "_session_digest.html", _session_digest, ("digest.",)),
    "session-traces": Panel(P + "_session_traces.html", traces.session_traces, ("otel.", "usage.")),
    "agent-checkpoints": Panel(P + "_agent_checkpoints.html", _agent_checkpoints, ("checkpoint.", "agent.")),
    "agent-cognitive": Panel(
        P + "_agent_cognitive.html", _agent_cognitive, ("state.", "cognitive", "checkpoint.")
    ),
    "agent-recovered": Panel(
        P + "_agent_recovered.html",
        _agent_recovered,
        ("checkpoint.", "state.", "task.", "session.", "agent.crash"),
    ),
    "agent-events": Panel(P + "_agent_events.html", _agent_events, ("*",)),
    "agent-traces": Panel(P + "_agent_traces.html", traces.agent_traces, ("otel.",)),
    "user-memories": Panel(P + "_user_memories.html", _user_memories, ("user_memory.", "user.")),
    "user-sessions": Panel(P + "_user_sessions.html", _user_sessions, ("session.", "user.")),
    "experiences-recent": Panel(
        P + "_experiences_recent.html", _experiences_recent, ("experience.", "memory.")
    ),
    "jobs-queues": Panel(P + "_jobs_queues.html", _jobs_queues, ("*",)),
    "jobs-failed": Panel(P + "_jobs_failed.html", _jobs_failed, ("failed", "_failed")),
    "jobs-results": Panel(
        P + "_jobs_results.html",
        _jobs_results,
        ("experience.", "memory.", "summary.", "digest.", "fact.", "retention."),
    ),
}

PAGE_PANELS: dict[str, list[str]] = {
    "overview": ["overview-stats", "overview-agents", "overview-sessions", "overview-events"],
    "session": [
        "session-header",
        "session-budget",
        "session-manifest",
        "session-digest",
        "session-summaries",
        "session-facts",
        "session-traces",
    ],
    "agent": ["agent-checkpoints", "agent-cognitive", "agent-recovered", "agent-events", "agent-traces"],
    "user": ["user-memories", "user-sessions"],
    "experiences": ["experiences-recent"],
    "jobs": ["jobs-queues", "jobs-failed", "jobs-results"],
}


def panel_context(name: str, **scope: Any) -> dict[str, Any]:
    return {**PANELS[name].build(**scope), "panel_id": f"panel-{name}"}


def panel_render(name: str, **scope: Any) -> str:
    return render_to_string(PANELS[name].template, {"p": panel_context(name, **scope)})


def page_panels(page: str, **scope: Any) -> dict[str, dict[str, Any]]:
    """Every panel context of a page, keyed by the panel name with `_` for `-` (for templates)."""
    return {name.replace("-", "_"): panel_context(name, **scope) for name in PAGE_PANELS[page]}


def panel_is_stale(name: str, event_type: str) -> bool:
    for trigger in PANELS[name].triggers:
        if (
            trigger == "*"
            or event_type.startswith(trigger)
            or (trigger in {"failed", "_failed"} and event_type.endswith(trigger))
        ):
            return True
    return False
