"""Collect step of the context pipeline: every candidate item for the next prompt, in manifest
order — system parts, tools, the user profile, pinned facts, memories, the summary (or the previous session's
digest), the history window, recalled items, open questions and the new input. Read-only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memory.models import MessageRole, Session, Summary, Tenant
from memory.services import decay, experience_search, tokens
from memory.services.context_history import history_groups, history_message, window_rows
from memory.services.context_items import (
    BuildRequest,
    Candidates,
    ContextItem,
    SystemPart,
    carried_over_message,
)
from memory.services.context_policy import EffectivePolicy
from memory.services.context_profile import profile_memory_ids, user_profile_item
from memory.services.context_recall import (
    RecalledItem,
    RecallRequest,
    context_recall,
    recall_policy_effective,
)
from memory.services.embedding import QueryEmbedding
from memory.services.session_digest import context_digest_for_session

IMPORTANCE_SCORE = {"high": 1.0, "medium": 0.6, "low": 0.3}


def candidates_collect(
    *,
    tenant: Tenant,
    session: Session,
    policy: EffectivePolicy,
    counter: tokens.TokenCounter,
    budget_tokens: int,
    request: BuildRequest,
) -> Candidates:
    """All candidates for the build, none counted yet. Read-only."""
    items = _system_part_items(policy, request.system_parts)
    tools_item = _tools_item(policy, request.tools, counter)
    summary = Summary.objects.filter(session=session, is_current=True).first()
    covered = summary.covers_up_to_seq if summary else 0
    window = _window_read(session=session, covered=covered, policy=policy, next_input=request.next_input)
    # The query is embedded once, when first needed, for the profile, experiences and recall alike.
    query_vector = QueryEmbedding(window.query)
    profile = user_profile_item(
        tenant=tenant,
        session=session,
        policy=policy,
        counter=counter,
        budget_tokens=budget_tokens,
        query=window.query,
        query_vector=query_vector,
    )
    if profile is not None:
        items.append(profile)
    facts = decay.facts_for_context(tenant=tenant, session=session)
    items += [_fact_item(fact) for fact in facts]
    recall_policy = recall_policy_effective(tenant=tenant, overrides=request.recall)
    # Experiences are carried over too: `recall.enabled = false` leaves them out with the rest.
    if recall_policy.enabled:
        items += _memory_items(
            tenant=tenant, session=session, policy=policy, query=window.query, query_vector=query_vector
        )
    if summary is not None:
        items.append(_summary_item(summary))
    # The previous session's digest is carried over like recall: `recall.enabled = false` drops it.
    previous_digest = _previous_digest_item(tenant=tenant, session=session) if recall_policy.enabled else None
    if previous_digest is not None:
        items.append(previous_digest)
    history = _history_collect(session=session, covered=covered, window=window, policy=policy)
    items += history.items

    recall = RecallRequest(
        session=session,
        policy=recall_policy,
        query=window.query,
        window_seqs=history.seqs,
        exclude_ids={i.id for i in items if i.kind in ("pinned_fact", "memory", "summary")}
        | profile_memory_ids(profile),
        budget_tokens=budget_tokens,
        query_vector=query_vector,
    )
    items += _recall_step(tenant=tenant, request=recall, counter=counter)
    questions_item = _questions_item(request.open_questions, request.next_actions)
    if questions_item is not None:
        items.append(questions_item)
    units = _input_step(items, history.units, request.next_input, from_history=window.input_seq is not None)
    return Candidates(
        items=items,
        tools=tools_item,
        history_units=units,
        questions=questions_item,
        recall_policy=recall_policy,
        covered=covered,
        outside=history.outside,
        warnings=_restated_warnings(facts),
    )


@dataclass
class _Window:
    rows: list[dict[str, Any]]  # the window's rows, oldest first, without the new input
    input_seq: int | None  # the new input's seq when the agent appended it before building
    query: str  # what memories and recall look for: the input, or the newest user message


@dataclass
class _History:
    items: list[ContextItem]  # orphaned tool results (left out), then the window's messages
    units: list[list[ContextItem]]  # the window's groups, oldest first
    seqs: set[int]  # the seqs the prompt carries verbatim (window and input)
    outside: int  # messages neither in the window nor in the summary


def _window_read(*, session: Session, covered: int, policy: EffectivePolicy, next_input: str) -> _Window:
    rows = window_rows(session=session, after_seq=covered, window=policy.history_window)
    input_seq = _input_seq(rows, next_input)
    if input_seq is not None:
        rows.pop()  # the agent appended the input before building: send it once, as the input
    query = next_input or next((r["content"] for r in reversed(rows) if r["role"] == MessageRole.USER), "")
    return _Window(rows=rows, input_seq=input_seq, query=query)


def _history_collect(*, session: Session, covered: int, window: _Window, policy: EffectivePolicy) -> _History:
    groups, orphans = history_groups(window.rows)
    selected = _window_groups(groups, policy.history_window)
    in_window = sum(len(g) for g in selected)
    from_history = int(window.input_seq is not None)
    outside = max(0, (session.message_seq - covered) - len(window.rows) - from_history) + (
        sum(len(g) for g in groups) - in_window
    )
    units = [_history_unit(group) for group in selected]
    seqs = {row["seq"] for group in selected for row in group}
    if window.input_seq is not None:
        seqs.add(window.input_seq)
    return _History(
        items=[_orphan_item(row) for row in orphans] + [i for unit in units for i in unit],
        units=units,
        seqs=seqs,
        outside=outside,
    )


def _input_step(
    items: list[ContextItem], units: list[list[ContextItem]], next_input: str, *, from_history: bool
) -> list[list[ContextItem]]:
    """Append the new input (required, last). Without one, the newest history unit is the input:
    required, and no longer droppable. Returns the droppable history units."""
    if next_input or from_history:
        items.append(
            ContextItem(
                "input",
                "input",
                "input",
                [{"role": "user", "content": next_input}],
                required=True,
                critical=True,
            )
        )
        return units
    if not units:
        return units
    for item in units[-1]:
        item.required, item.reason = True, "included (newest message)"
    return units[:-1]


def _mode_config(policy: EffectivePolicy) -> tuple[set[str] | None, bool]:
    config = policy.mode_parts.get(policy.mode) or {}
    names = config.get("system_parts", ["*"])
    allowed = None if "*" in names else set(names)
    return allowed, bool(config.get("tools", True))


def _system_part_items(policy: EffectivePolicy, parts: list[SystemPart]) -> list[ContextItem]:
    allowed, _ = _mode_config(policy)
    items = []
    for part in parts:
        item = ContextItem(
            "system_part",
            "system",
            f"system:{part.name}",
            [{"role": "system", "content": part.content}],
            critical=part.critical,
            required=True,
        )
        if allowed is not None and part.name not in allowed:
            item.exclude(f"not used in mode {policy.mode!r}")
        items.append(item)
    return items


def _tools_item(
    policy: EffectivePolicy, tools: list[Any], counter: tokens.TokenCounter
) -> ContextItem | None:
    if not tools:
        return None
    item = ContextItem("tools", "tools", "tools", [], required=True, extra={"count": len(tools)})
    item.tokens = counter.tools_tokens(tools)
    _, tools_enabled = _mode_config(policy)
    if not tools_enabled:
        item.exclude(f"not used in mode {policy.mode!r}")
    return item


def _fact_item(fact: decay.PinnedFact) -> ContextItem:
    note = " (restated: it has not come up for a while)" if fact.restated else ""
    high = fact.importance == "high"
    return ContextItem(
        "pinned_fact",
        "pinned_facts",
        fact.fact_id,
        [{"role": "system", "content": f"Pinned fact — {fact.key}{note}: {fact.content}"}],
        score=IMPORTANCE_SCORE.get(fact.importance, 0.3),
        critical=high,
        required=high,
        extra={"importance": fact.importance, "restated": fact.restated},
    )


def _restated_warnings(facts: list[decay.PinnedFact]) -> list[dict[str, Any]]:
    restated = [f for f in facts if f.restated]
    if not restated:
        return []
    return [
        {
            "code": "restated_facts",
            "message": f"{len(restated)} decayed fact(s) restated at the start of the prompt.",
            "facts": [f.fact_id for f in restated],
        }
    ]


def _input_seq(rows: list[dict[str, Any]], next_input: str) -> int | None:
    """The seq of the newest row when it is the new input itself (appended before the build)."""
    if next_input and rows and rows[-1]["role"] == MessageRole.USER and rows[-1]["content"] == next_input:
        return int(rows[-1]["seq"])
    return None


def _memory_items(
    *, tenant: Tenant, session: Session, policy: EffectivePolicy, query: str, query_vector: QueryEmbedding
) -> list[ContextItem]:
    if not (policy.memory_limit and policy.memory_max_chars):
        return []
    memories = experience_search.experiences_for_context(
        tenant=tenant,
        session=session,
        query=query,
        limit=policy.memory_limit,
        max_chars=policy.memory_max_chars,
        query_vector=query_vector,
    )
    items = []
    used_chars = 0
    for rank, memory in enumerate(memories):
        item = ContextItem(
            "memory",
            "memories",
            memory.experience_id,
            [
                carried_over_message(
                    f"Relevant past experience: {memory.text}",
                    source="experience",
                    agent=memory.agent,
                    session=memory.session or "",
                )
            ],
            score=round(memory.score, 4),
            extra={"agent": memory.agent, "session": memory.session},
        )
        if rank >= policy.memory_limit or used_chars + len(memory.text) > policy.memory_max_chars:
            item.included, item.reason = False, "over the memory limit"
        else:
            used_chars += len(memory.text)
        items.append(item)
    return items


def _summary_item(summary: Summary) -> ContextItem:
    return ContextItem(
        "summary",
        "summary",
        summary.public_id,
        [
            {
                "role": "system",
                "content": "Summary of the conversation so far "
                f"(messages 1-{summary.covers_up_to_seq}):\n{summary.text}",
            }
        ],
        extra={"covers_up_to_seq": summary.covers_up_to_seq},
    )


def _previous_digest_item(*, tenant: Tenant, session: Session) -> ContextItem | None:
    """The same user's previous session digest, offered while this session has none (medium-term
    memory, memory/services/session_digest.py). Placed and dropped like the summary."""
    offered = context_digest_for_session(tenant=tenant, session=session)
    if offered is None:
        return None
    return ContextItem(
        "summary",
        "summary",
        f"digest:{offered.session_id}:v{offered.digest.version}",
        [
            carried_over_message(
                f"Digest of this user's previous session ({offered.session_id}):\n{offered.digest.text}",
                source="previous_session_digest",
                agent=offered.agent,
                session=offered.session_id,
            )
        ],
        extra={"source": "previous_session_digest", "session": offered.session_id, "agent": offered.agent},
    )


def _orphan_item(row: dict[str, Any]) -> ContextItem:
    return ContextItem(
        "history",
        "history",
        f"msg:{row['seq']}",
        [],
        included=False,
        reason="tool result whose call is outside the window",
        extra={"seq": row["seq"]},
    )


def _window_groups(groups: list[list[dict[str, Any]]], window: int) -> list[list[dict[str, Any]]]:
    """The newest groups while their messages fit in `window`, oldest first."""
    selected: list[list[dict[str, Any]]] = []
    count = 0
    for group in reversed(groups):
        if count + len(group) > window:
            break
        selected.append(group)
        count += len(group)
    selected.reverse()
    return selected


def _history_unit(group: list[dict[str, Any]]) -> list[ContextItem]:
    label = f"seq:{group[0]['seq']}-{group[-1]['seq']}" if len(group) > 1 else None
    unit = []
    for row in group:
        meta = row["metadata"] or {}
        unit.append(
            ContextItem(
                "history",
                "history",
                f"msg:{row['seq']}",
                [history_message(row)],
                group=label,
                critical=bool(meta.get("critical") or meta.get("importance") == "high"),
                extra={"seq": row["seq"], "role": row["role"]},
            )
        )
    return unit


def _recall_step(
    *, tenant: Tenant, request: RecallRequest, counter: tokens.TokenCounter
) -> list[ContextItem]:
    """The `recall` component: items from outside the window relevant to the query (manifest
    entries carry their score and why they were chosen). Read-only."""

    def block(item: RecalledItem, text: str) -> dict[str, Any]:
        return carried_over_message(text, source=item.kind, agent=item.agent, session=item.session or "")

    recalled = context_recall(
        tenant=tenant,
        request=request,
        # What an item costs is the block it goes into the prompt as (the carried-over note and
        # its tags, the session's and agent's included): what the manifest then counts.
        count_tokens=lambda item, text: counter.message_tokens(block(item, text)),
    )
    return [
        ContextItem(
            "recall",
            "recall",
            f"recall:{item.kind}:{item.id}",
            [block(item, item.text)],
            score=round(item.score, 4),
            reason=item.reason,
            extra={
                "source": item.kind,
                "source_id": item.id,
                "agent": item.agent,
                "session": item.session,
                "seq": item.seq,
                "seqs": item.seqs,
                "occurred_at": item.occurred_at,
                "contributions": item.contributions,
            },
        )
        for item in recalled
    ]


def _questions_item(open_questions: list[str], next_actions: list[str]) -> ContextItem | None:
    parts = []
    if open_questions:
        parts.append("Open questions:\n" + "\n".join(f"- {q}" for q in open_questions))
    if next_actions:
        parts.append("Next actions:\n" + "\n".join(f"- {a}" for a in next_actions))
    if not parts:
        return None
    return ContextItem(
        "open_questions",
        "open_questions",
        "open_questions",
        [{"role": "system", "content": "\n\n".join(parts)}],
    )
