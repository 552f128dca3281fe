"""Read adapters for the capabilities built beside the dashboard (context, experiences,
cognition, decay, recovery).

Each function returns the data its panel shows — never invented data. They only read: models of
`memory` and the read-only service functions the capabilities expose, imported directly so that a
rename is a type error, not a blank panel.
"""

from __future__ import annotations

from typing import Any

from dashboard import charts
from dashboard.langgraph_values import langgraph_values_decoded
from dashboard.selectors import experience_problems, fact_keys, session_events
from memory.exceptions import NotFound
from memory.models import DIGEST_CATEGORIES, Agent, Checkpoint, Session, SessionStatus, Tenant
from memory.services import cognition, experience_search
from memory.services.context import budget_samples_list, context_policy_read
from memory.services.decay import facts_list
from memory.services.experiences import experiences_list
from memory.services.rolling_summary import summaries_list
from memory.services.session_digest import HEADINGS, session_digests_list

BUDGET_SAMPLES_PLOTTED = 60
FACTS_SHOWN = 50


def session_budget(*, tenant: Tenant, session: Session) -> Any:
    """Gauge, stacked components, line over time with summarisation markers, and the forecast.

    The share of the budget is computed here once (`charts.share_text`, prompt tokens of the
    input window) and reused by the gauge, its caption and the manifest's warnings."""
    samples = list(
        reversed(budget_samples_list(tenant=tenant, session=session, limit=BUDGET_SAMPLES_PLOTTED))
    )
    if not samples:
        return {"latest": None}
    latest = samples[-1]
    threshold = (
        latest.threshold_tokens / latest.input_limit
        if latest.input_limit
        else context_policy_read(tenant=tenant, session=session).summarise_threshold
    )
    markers = [
        charts.Marker(
            at=event.created_at, label=f"summary up to #{event.payload.get('covers_up_to_seq', '?')}"
        )
        for event in session_events(tenant=tenant, session=session, types=["summary.created"], limit=100)
    ]
    markers += [
        charts.Marker(at=sample.created_at, label="summarisation queued")
        for sample in samples
        if sample.summarisation_queued
    ]
    parts = [(name, int(value)) for name, value in (latest.components or {}).items() if value]
    return {
        "latest": {"used": latest.prompt_tokens, "limit": latest.input_limit, "sample": latest},
        "share": charts.share_text(used=latest.prompt_tokens, limit=latest.input_limit),
        "gauge": charts.gauge(used=latest.prompt_tokens, limit=latest.input_limit, threshold=threshold),
        "stacked": charts.stacked_bar(parts=parts, limit=latest.input_limit),
        "line": charts.line_chart(
            points=[(s.created_at, s.prompt_tokens) for s in samples],
            limit=latest.input_limit,
            threshold=threshold,
            markers=markers,
        ),
        "markers": markers,
        "forecast_text": _forecast_text(latest.forecast or {}, status=session.status),
        "reserve": latest.output_reserve,
        "model": latest.model_name,
        "exact": latest.exact,
        "threshold": threshold,
    }


def _forecast_text(forecast: dict[str, Any], *, status: str = SessionStatus.OPEN) -> str:
    if status != SessionStatus.OPEN:
        # No turn follows on a session that is over: a forecast of turns would be fiction.
        return f"The session is {status}: no further turns, so no forecast."
    if not forecast:
        return ""
    until = forecast.get("turns_until_summarisation")
    window = forecast.get("turns_until_window")
    growth = forecast.get("growth_tokens_per_turn") or 0
    basis = "recent builds" if forecast.get("basis") == "builds" else "the current window"
    if until == 0:
        return "At or above the summarisation threshold now."
    if until is None or growth <= 0:
        trend = "Shrinking" if growth < 0 else "Not growing"
        return f"{trend} over {basis}: no threshold in sight."
    text = f"About {until} turn{'s' if until != 1 else ''} until the summarisation threshold"
    if window is not None:
        text += f", {window} until the budget is full"
    return text + f" (≈{growth:,.0f} tokens per turn over {basis})."


def session_manifest(*, tenant: Tenant, session: Session) -> Any:
    """The latest build's manifest: every item, included or dropped, in prompt order, each named
    by what it is (a fact's key, `msg #52`, …) and where critical ones sit.

    The `risky` flag is the engine's (decided with the policy the build used); the shaded middle
    band is the session's effective context policy."""
    latest = next(iter(budget_samples_list(tenant=tenant, session=session, limit=1)), None)
    if latest is None:
        return {"items": []}
    policy = context_policy_read(tenant=tenant, session=session)
    middle = (policy.middle_start, policy.middle_end)
    manifest = latest.manifest or {}
    entries = manifest.get("items", [])
    names = manifest_names(tenant=tenant, entries=entries)
    items = [_manifest_row(entry, span=_placed_span(manifest), names=names) for entry in entries]
    items.sort(key=_prompt_order)
    strip = charts.position_strip(
        items=[
            (i["label"], i["position"] / 100, True)
            for i in items
            if i["critical"] and i["position"] is not None
        ],
        middle=middle,
    )
    return {
        "items": items,
        "strip": strip,
        "middle": {"start": round(middle[0] * 100), "end": round(middle[1] * 100)},
        "built_at": latest.created_at,
        "build_id": latest.public_id,
        "total_tokens": manifest.get("total_tokens") or latest.prompt_tokens,
        "share": charts.share_text(used=latest.prompt_tokens, limit=latest.input_limit),
        "critical_count": sum(1 for i in items if i["critical"] and i["included"]),
        "risky_count": sum(1 for i in items if i["risky"]),
        "included_count": sum(1 for i in items if i["included"]),
        "dropped_count": sum(1 for i in items if not i["included"]),
        "warnings": [_warning_text(w, sample=latest, names=names) for w in latest.warnings or []],
    }


def _prompt_order(row: dict[str, Any]) -> tuple[int, int]:
    """Tools first (sent beside the messages, before them), then the placed items by where they
    start, then what was left out (in manifest order: the sort is stable)."""
    if not row["included"]:
        return (2, 0)
    return (0, 0) if row["offset"] is None else (1, row["offset"])


def _placed_span(manifest: dict[str, Any]) -> int:
    """Tokens of the placed messages and the reply priming: the length the engine measures
    positions against, so every row's position is on the same scale as the critical ones'."""
    ends = [
        e["offset"] + e.get("tokens", 0) for e in manifest.get("items", []) if e.get("offset") is not None
    ]
    return (max(ends) if ends else 0) + int(manifest.get("priming_tokens") or 0) or 1


def manifest_names(*, tenant: Tenant, entries: list[dict[str, Any]]) -> dict[str, str]:
    """A readable name for each manifest item id: a fact's key, an experience's problem, …"""
    known = {
        **fact_keys(tenant=tenant, fact_ids=[e["id"] for e in entries if e.get("kind") == "pinned_fact"]),
        **experience_problems(
            tenant=tenant, experience_ids=[e["id"] for e in entries if e.get("kind") == "memory"]
        ),
    }
    names = {}
    for entry in entries:
        item_id, kind = str(entry.get("id") or ""), entry.get("kind", "")
        names[item_id] = _item_name(entry, kind=kind, item_id=item_id, known=known)
    return names


def _item_name(entry: dict[str, Any], *, kind: str, item_id: str, known: dict[str, str]) -> str:
    if kind == "pinned_fact":
        return f"fact {known.get(item_id, item_id)}"
    if kind == "memory":
        return f"experience: {known.get(item_id, item_id)}"
    if kind == "user_profile":
        memories = entry.get("memories") or []
        taken = sum(1 for m in memories if m.get("included"))
        return f"user profile: {taken} of {len(memories)} memories"
    if kind == "recall":
        source = str(entry.get("source") or "item").replace("_", " ")
        return f"recalled msg #{entry['seq']}" if entry.get("seq") is not None else f"recalled {source}"
    if entry.get("seq") is not None:
        return f"msg #{entry['seq']}"
    if kind == "system_part":
        return f"system: {item_id.removeprefix('system:')}"
    if kind == "summary" and entry.get("covers_up_to_seq") is not None:
        return f"summary of #1 to #{entry['covers_up_to_seq']}"
    if kind == "summary" and entry.get("source") == "previous_session_digest":
        return f"digest of session {entry.get('session', '')}"
    if kind == "tools":
        return f"tools ({entry.get('count', 0)})"
    if kind == "input":
        return "next input"
    return item_id or kind


def _manifest_row(entry: dict[str, Any], *, span: int, names: dict[str, str]) -> dict[str, Any]:
    """One manifest entry for the table, positioned by where it starts in the prompt."""
    offset = entry.get("offset")
    position = entry.get("position")
    if position is None and offset is not None:
        position = offset / span
    kind = entry.get("kind", "")
    return {
        "label": names.get(str(entry.get("id") or ""), kind),
        "kind": kind,
        "colour": charts.component_colour(entry.get("component") or kind),
        "tokens": entry.get("tokens", 0),
        "included": entry.get("included", True),
        "critical": entry.get("critical", False),
        "reason": entry.get("reason", ""),
        "offset": offset if entry.get("included", True) else None,
        "position": position * 100 if position is not None else None,
        "risky": bool(entry.get("risky")),
        "memories": entry.get("memories") or [],  # user_profile: each memory considered, and why
    }


def _warning_text(warning: Any, *, sample: Any, names: dict[str, str]) -> str:
    """A build warning in the dashboard's words: the budget share is the gauge's, and items are
    named as in the table."""
    if not isinstance(warning, dict):
        return str(warning)
    if warning.get("code") == "near_limit":
        left = sample.input_limit - sample.output_reserve - sample.prompt_tokens
        return (
            f"The prompt uses {sample.prompt_tokens:,} of the {sample.input_limit:,}-token input window "
            f"({charts.share_text(used=sample.prompt_tokens, limit=sample.input_limit)}); with "
            f"{sample.output_reserve:,} kept for the reply, {max(left, 0):,} tokens are left."
        )
    if warning.get("code") == "critical_in_middle" and warning.get("item") in names:
        position = warning.get("position")
        where = f" ({position * 100:.0f} %)" if isinstance(position, int | float) else ""
        return (
            f"Critical {names[warning['item']]} sits in the middle of the prompt{where}, "
            "where models attend least."
        )
    return str(warning.get("message", warning.get("code", "")))


def session_summaries(*, tenant: Tenant, session: Session) -> Any:
    return [
        {
            "covers_to": s.covers_up_to_seq,
            "tokens": s.tokens,
            "text": s.text,
            "created_at": s.created_at,
            "current": s.is_current,
            "method": s.method,
            "folded": s.folded_count,
            "before": s.tokens_before,
        }
        for s in summaries_list(tenant=tenant, session=session, limit=10)
    ]


def session_digest(*, tenant: Tenant, session: Session) -> Any:
    """The latest digest of the session by category, with how many versions there are."""
    versions = session_digests_list(tenant=tenant, session=session)
    latest = versions.order_by("-version").first()
    if latest is None:
        return {"latest": None}
    return {
        "latest": {
            "version": latest.version,
            "method": latest.method,
            "error": latest.error,
            "covers_to": latest.covers_up_to_seq,
            "created_at": latest.created_at,
            "sections": [
                {"heading": HEADINGS[c], "items": latest.content.get(c) or []}
                for c in DIGEST_CATEGORIES
                if latest.content.get(c)
            ],
        },
        "versions": versions.count(),
    }


DECAY_ORDER = {"decayed": 0, "at_risk": 1, "fresh": 2}


def session_facts(*, tenant: Tenant, session: Session) -> Any:
    """Tracked facts with their decay state, most at risk first: decayed, then at risk, then
    fresh, each by the user turns left before it decays (fewest first)."""
    _, statuses = facts_list(tenant=tenant, session=session)
    rows = [_fact_row(status) for status in statuses]
    rows.sort(key=lambda r: (DECAY_ORDER[r["state"]], r["rounds_left"] or 0, r["key"]))
    return rows[:FACTS_SHOWN]


def _fact_row(status: Any) -> dict[str, Any]:
    left = status.threshold - status.rounds_since_reference
    state = "decayed" if status.decayed else ("at_risk" if left <= max(2, status.threshold // 4) else "fresh")
    return {
        "key": status.fact.key,
        "type": status.fact.fact_type,
        "content": status.fact.content,
        "importance": status.fact.importance,
        "rounds_since": status.rounds_since_reference,
        "threshold": status.threshold,
        "rounds_left": max(left, 0) if not status.decayed else None,
        "state": state,
        "recommendation": status.recommendation,
        "references": status.fact.reference_count,
    }


CHECKPOINTS_SHOWN = 50


def agent_checkpoints(*, tenant: Tenant, agent: Agent) -> list[Checkpoint]:
    """The agent's newest checkpoints, newest first (the models: the template reads their fields)."""
    return list(cognition.checkpoints_list(tenant=tenant, agent=agent).order_by("-seq")[:CHECKPOINTS_SHOWN])


def agent_cognitive_state(*, tenant: Tenant, agent: Agent) -> Any:
    view = cognition.state_get(tenant=tenant, agent=agent)
    if view.version == 0:
        return None
    return {
        "schema_version": view.schema_version,
        "version": view.version,
        "updated_at": view.updated_at,
        "checkpoint": view.checkpoint,
        "fields": list(view.document.items()),
    }


def checkpoint_get(*, tenant: Tenant, agent: Agent, checkpoint_id: str) -> Any | None:
    """One checkpoint with its reconstructed state (None if missing, foreign or not landed)."""
    try:
        checkpoint = cognition.checkpoint_get(tenant=tenant, agent=agent, ref=checkpoint_id)
    except NotFound:
        return None
    return {
        "seq": checkpoint.seq,
        "id": checkpoint.public_id,
        "reason": checkpoint.reason,
        "created_at": checkpoint.created_at,
        "state": langgraph_values_decoded(cognition.checkpoint_state(checkpoint=checkpoint)),
    }


def checkpoint_diff(*, tenant: Tenant, agent: Agent, a: str, b: str) -> Any | None:
    """Per-field differences from checkpoint `a` to `b` (None if either is missing)."""
    if not a or not b:
        return None
    try:
        result = cognition.checkpoint_diff(tenant=tenant, agent=agent, source=a, target=b)
    except NotFound:
        return None
    return {
        "a": {"seq": result.source.seq, "id": result.source.public_id},
        "b": {"seq": result.target.seq, "id": result.target.public_id},
        "fields": [
            {"path": c["path"], "change": c["change"], "before": c.get("old"), "after": c.get("new")}
            for c in result.changes
        ],
    }


EXPERIENCES_SHOWN = 25


def experience_card(x: Any) -> dict[str, Any]:
    """What the dashboard shows of one experience: text, origin, agent, merged texts, embedding, links."""
    links = []
    if x.merged_into_id:
        links.append({"kind": "merged into", "target": x.merged_into.public_id})
    if x.superseded_by_id:
        links.append({"kind": "superseded by", "target": x.superseded_by.public_id})
    if x.merge_count:
        links.append({"kind": "absorbed", "target": f"{x.merge_count} duplicate(s)"})
    return {
        "public_id": x.public_id,
        "problem": x.problem,
        "cause": x.cause,
        "solution": x.solution,
        "confidence": x.confidence,
        "kind": x.kind,
        "extraction_method": x.extraction_method,
        "embedding_status": x.embedding_status,
        "embedding_model": x.embedding_model,
        "embedding_error": x.embedding_error,
        "use_count": x.use_count,
        "created_at": x.created_at,
        "user_id": x.user_id,
        "agent": x.agent,
        "aliases": [line for line in x.aliases.splitlines() if line],  # texts merged into it
        "source_task_public_id": x.source_task.public_id if x.source_task_id else "",
        "source_task_id": x.source_task_id,
        "source_session": x.source_session.public_id if x.source_session_id else "",
        "provenance": x.provenance,
        "links": links,
    }


def experiences_recent(*, tenant: Tenant) -> Any:
    rows = experiences_list(tenant=tenant, include_superseded=True).order_by("-created_at")[
        :EXPERIENCES_SHOWN
    ]
    return [experience_card(x) for x in rows]


def experiences_search(*, tenant: Tenant, query: str, user_id: str = "") -> Any:
    """Hybrid search results with each signal's contribution to the score."""
    result = experience_search.experiences_search(
        tenant=tenant, query=query, user_id=user_id or None, limit=10
    )
    hits = []
    for hit in result.hits:
        signals = [(name, value) for name, value in (hit.contributions or {}).items()]
        hits.append(
            {
                "experience": experience_card(hit.experience),
                "score": hit.score,
                "similarity": hit.similarity,
                "text_score": hit.text_score,
                "signals": signals,
                "signals_svg": charts.contribution_bar(parts=signals, full=max(hit.score, 1.0)),
            }
        )
    return {"hits": hits, "plan": result.plan, "warnings": result.warnings}
