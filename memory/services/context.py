"""The context builder: "what do I send next?" for one session and the next input.

A build gathers, in placement order for the U-shaped attention curve: static system parts
(cache-friendly, first), pinned facts, retrieved memories, the rolling summary, the recent
history window, open questions / next actions, and the new input (last). It fits them to the
model's budget (input limit - output reserve) by dropping the oldest history first — tool-call
groups as a whole — then the weakest memories, open questions, the summary and the less
important facts; required parts (system parts of the mode, tools, high-importance facts, the
newest input) are never dropped. If even those exceed the gate → PromptTooLong.

Counting: every number comes from one TokenCounter (memory.services.tokens): each message costs
3 + tokens(role) + tokens(content) [+ 1 + tokens(name)] [+ tokens(tool_calls JSON)]
[+ tokens(tool_call_id)], a prompt adds 3 reply-priming tokens and the compact JSON of its tool
schemas. So the manifest's total is exactly the count of the returned prompt.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.exceptions import InvalidInput, NotFound, PromptTooLong
from memory.models import (
    BudgetSample,
    ContextPolicy,
    Message,
    MessageRole,
    Session,
    SessionContextPolicy,
    Summary,
    Tenant,
    TokenUsageReport,
)
from memory.services import decay, model_profiles, recorder, retrieval, tokens
from memory.services.recall import RecallPolicy, context_recall, recall_policy_effective

REQUEUE_AFTER = timedelta(seconds=60)
WINDOW_MARGIN = 64  # extra rows read past the window so a tool-call group at its edge is seen whole
COMPONENTS = (
    "system",
    "tools",
    "pinned_facts",
    "memories",
    "recall",
    "summary",
    "history",
    "open_questions",
    "input",
    "overhead",
)

# name → (type, minimum, maximum); the keys a session or a request may override
POLICY_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "history_window": (int, 1, 10_000),
    "summarise_threshold": (float, 0.05, 1.0),
    "keep_verbatim": (int, 0, 10_000),
    "output_reserve": (int, 0, 10_000_000),
    "char_gate": (int, 0, 100_000_000),
    "memory_limit": (int, 0, 100),
    "memory_max_chars": (int, 0, 1_000_000),
    "near_limit": (float, 0.1, 1.0),
    "middle_start": (float, 0.0, 1.0),
    "middle_end": (float, 0.0, 1.0),
    "mode": (str, None, None),
    "summary_max_tokens": (int, 50, 100_000),
    "max_input_tokens": (int, 256, 100_000_000),  # caps the model's input limit (override only)
}


@dataclass(frozen=True)
class EffectivePolicy:
    history_window: int
    summarise_threshold: float
    keep_verbatim: int
    output_reserve: int
    char_gate: int
    memory_limit: int
    memory_max_chars: int
    near_limit: float
    middle_start: float
    middle_end: float
    mode: str
    summary_max_tokens: int
    max_input_tokens: int | None
    mode_parts: dict[str, Any]
    default_model: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def policy_overrides_validate(overrides: Any, *, field_name: str = "budget") -> dict[str, Any]:
    """Check override keys, types and bounds. Raises InvalidInput naming the field."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise InvalidInput(details={"fields": {field_name: ["Expected an object."]}})
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in POLICY_FIELDS:
            raise InvalidInput(
                f"Unknown policy key {key!r}; known: {', '.join(sorted(POLICY_FIELDS))}.",
                details={"fields": {f"{field_name}.{key}": ["Unknown key."]}},
            )
        kind, low, high = POLICY_FIELDS[key]
        ok = (
            isinstance(value, str)
            if kind is str
            else (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and (kind is float or float(value).is_integer())
            )
        )
        if not ok:
            raise InvalidInput(details={"fields": {f"{field_name}.{key}": [f"Expected {kind.__name__}."]}})
        if kind is not str:
            value = kind(value)
            if (low is not None and value < low) or (high is not None and value > high):
                raise InvalidInput(
                    details={"fields": {f"{field_name}.{key}": [f"Must be between {low} and {high}."]}}
                )
        clean[key] = value
    return clean


def context_policy_effective(
    *, tenant: Tenant, session: Session, overrides: dict[str, Any] | None = None
) -> EffectivePolicy:
    """Tenant policy ← session metadata `context_policy` (set at create) ← SessionContextPolicy ←
    this request's overrides. Read-only (creates the tenant's policy row on first use)."""
    base = ContextPolicy.for_tenant(tenant)
    values: dict[str, Any] = {key: getattr(base, key) for key in POLICY_FIELDS if key != "max_input_tokens"}
    values["max_input_tokens"] = None
    layers = [
        policy_overrides_validate(
            (session.metadata or {}).get("context_policy"), field_name="metadata.context_policy"
        ),
    ]
    stored = SessionContextPolicy.objects.filter(session=session).values_list("overrides", flat=True).first()
    layers.append(stored or {})
    layers.append(overrides or {})
    for layer in layers:
        values.update(layer)
    mode_parts = base.mode_parts or {}
    if values["mode"] not in mode_parts:
        raise InvalidInput(
            f"Unknown mode {values['mode']!r}; this tenant's modes: {', '.join(sorted(mode_parts))}.",
            details={"fields": {"mode": ["Unknown mode."]}},
        )
    if values["middle_start"] > values["middle_end"]:
        raise InvalidInput(details={"fields": {"budget.middle_start": ["Must not exceed middle_end."]}})
    return EffectivePolicy(**values, mode_parts=mode_parts, default_model=base.default_model)


def session_context_policy_set(
    *, tenant: Tenant, session: Session, overrides: dict[str, Any]
) -> SessionContextPolicy:
    """Replace the session's policy overrides (validated). Records `context.policy_changed`. Idempotent."""
    clean = policy_overrides_validate(overrides, field_name="overrides")
    with transaction.atomic():
        row, _ = SessionContextPolicy.objects.update_or_create(
            session=session, defaults={"tenant": tenant, "overrides": clean, "updated_at": timezone.now()}
        )
        context_policy_effective(
            tenant=tenant, session=session
        )  # e.g. an unknown mode fails here, rolled back
        recorder.event_append(
            tenant=tenant, type="context.policy_changed", session=session, payload={"overrides": clean}
        )
    return row


# --- the build ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemPart:
    name: str
    content: str
    critical: bool = False


@dataclass
class _Item:
    kind: str  # system_part | tools | pinned_fact | memory | summary | history | open_questions | input
    component: str
    id: str
    messages: list[dict[str, Any]]
    tokens: int = 0
    score: float | None = None
    critical: bool = False
    required: bool = False
    group: str | None = None
    included: bool = True
    reason: str = "included"
    offset: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        entry = {
            "kind": self.kind,
            "id": self.id,
            "component": self.component,
            "tokens": self.tokens,
            "score": self.score,
            "critical": self.critical,
            "required": self.required,
            "included": self.included,
            "reason": self.reason,
        }
        if self.group is not None:
            entry["group"] = self.group
        if self.offset is not None:
            entry["offset"] = self.offset
        entry.update(self.extra)
        return entry


@dataclass
class BuiltContext:
    build_id: str
    model: dict[str, Any]
    messages: list[dict[str, Any]]
    tools: list[Any]
    manifest: dict[str, Any]
    budget: dict[str, Any]
    warnings: list[dict[str, Any]]
    forecast: dict[str, Any]
    summarisation: dict[str, Any]
    policy: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _history_message(row: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": row["role"], "content": row["content"]}
    if row["tool_calls"]:
        message["tool_calls"] = row["tool_calls"]
        if not row["content"]:
            message["content"] = None
    if row["role"] == MessageRole.TOOL and row["tool_call_id"]:
        message["tool_call_id"] = row["tool_call_id"]
    name = (row["metadata"] or {}).get("name")
    if isinstance(name, str) and name:
        message["name"] = name
    return message


def _tool_call_ids(tool_calls: Any) -> set[str]:
    ids = set()
    for call in tool_calls or []:
        if isinstance(call, dict) and call.get("id"):
            ids.add(str(call["id"]))
    return ids


def history_groups(rows: list[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Group rows (seq order) into units that are kept or dropped whole: an assistant message with
    tool_calls together with the tool results answering it; every other message alone. Returns
    (groups, orphans): tool results whose call is not among the rows (cut off by the window)."""
    groups: list[list[dict[str, Any]]] = []
    orphans: list[dict[str, Any]] = []
    open_group: list[dict[str, Any]] | None = None
    open_ids: set[str] = set()
    for row in rows:
        if row["role"] == MessageRole.TOOL:
            if open_group is not None and (row["tool_call_id"] in open_ids or not row["tool_call_id"]):
                open_group.append(row)
                continue
            orphans.append(row)
            continue
        open_group, open_ids = None, set()
        group = [row]
        groups.append(group)
        if row["role"] == MessageRole.ASSISTANT and row["tool_calls"]:
            open_group, open_ids = group, _tool_call_ids(row["tool_calls"])
    return groups, orphans


def _window_rows(*, session: Session, after_seq: int, window: int) -> list[dict[str, Any]]:
    """The newest `window` (+ margin) messages after `after_seq`, oldest first.

    Seqs are gapless, so the window is a seq range: bounding it explicitly keeps the query on the
    (session, seq) index whatever the planner's statistics say (a bare `ORDER BY seq DESC LIMIT`
    was planned as a scan + sort of the whole session on a freshly loaded table). Its cost
    follows the window, not the history."""
    lowest = max(after_seq, session.message_seq - window - WINDOW_MARGIN)
    rows = list(
        Message.objects.filter(session=session, seq__gt=lowest)
        .order_by("-seq")
        .values("seq", "role", "content", "tool_calls", "tool_call_id", "metadata")[: window + WINDOW_MARGIN]
    )
    rows.reverse()
    return rows  # type: ignore[return-value]


def _previous_digest_item(*, tenant: Tenant, session: Session) -> _Item | None:
    """The same user's previous session digest, offered while this session has none (medium-term
    memory, memory/services/digest.py). Placed and dropped like the summary."""
    from memory.services.digest import context_digest_for_session

    offered = context_digest_for_session(tenant=tenant, session=session)
    if offered is None:
        return None
    return _Item(
        "summary",
        "summary",
        f"digest:{offered.session_id}:v{offered.digest.version}",
        [
            {
                "role": "system",
                "content": f"Digest of this user's previous session ({offered.session_id}):\n"
                f"{offered.digest.text}",
            }
        ],
        extra={"source": "previous_session_digest", "session": offered.session_id},
    )


def _mode_config(policy: EffectivePolicy, mode: str) -> tuple[set[str] | None, bool]:
    config = policy.mode_parts.get(mode) or {}
    names = config.get("system_parts", ["*"])
    allowed = None if "*" in names else set(names)
    return allowed, bool(config.get("tools", True))


def context_build(
    *,
    tenant: Tenant,
    session: Session,
    next_input: str | None,
    model_name: str = "",
    system_parts: list[SystemPart] | None = None,
    tools: list[Any] | None = None,
    open_questions: list[str] | None = None,
    next_actions: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
    recall: dict[str, Any] | None = None,
) -> BuiltContext:
    """Assemble the next prompt for `session` within its model's budget.

    `recall` overrides the tenant's recall policy for this build (enabled, top_k, min_score,
    position, budget_share, query): see `_recall_step` and memory/services/recall.py.

    Not read-only: records a BudgetSample and a `context.built` event (one transaction), tells
    decay and retrieval what the prompt carried, and — when the prompt reaches the summarisation
    threshold or history had to be dropped — enqueues summarisation after commit. Not idempotent
    (each call is a new build). Raises PromptTooLong when the new input exceeds the character gate
    or the minimal context exceeds input limit - output reserve; InvalidInput for bad overrides.
    """
    policy = context_policy_effective(tenant=tenant, session=session, overrides=overrides)
    mode = policy.mode
    model = model_profiles.model_profile_resolve(
        tenant=tenant, name=model_name or session.model_name or policy.default_model
    )
    usage_factor, usage_reports = (
        (1.0, 0) if model.exact else model_profiles.usage_correction(tenant=tenant, model_name=model.name)
    )
    counter = tokens.TokenCounter(
        model.tokenizer,
        1.0
        if model.exact
        else tokens.clamp_factor(model_profiles.family_factor(model.tokenizer) * usage_factor),
    )
    next_input = next_input or ""
    if "\x00" in next_input:  # PostgreSQL text cannot hold it; messages never contain it either
        raise InvalidInput(details={"fields": {"input": ["Null characters are not allowed."]}})
    try:
        next_input.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (e.g. "\ud800" in JSON): not text any store accepts
        raise InvalidInput(
            details={"fields": {"input": ["Not valid Unicode text (lone surrogate)."]}}
        ) from None

    if policy.char_gate and len(next_input) > policy.char_gate:
        raise PromptTooLong(
            f"The input has {len(next_input):,} characters; the character gate allows {policy.char_gate:,}.",
            details={"gate": "characters", "input_chars": len(next_input), "char_gate": policy.char_gate},
        )
    input_limit = min(model.input_limit, policy.max_input_tokens or model.input_limit)
    reserve = min(policy.output_reserve, model.output_limit)
    budget = input_limit - reserve
    if budget <= 0:
        raise InvalidInput(
            f"The output reserve ({reserve:,}) leaves no room in the input limit ({input_limit:,}).",
            details={"fields": {"budget.output_reserve": ["Must be below the model's input limit."]}},
        )

    warnings: list[dict[str, Any]] = []
    if not model.known:
        warnings.append(
            {
                "code": "unknown_model",
                "message": f"Model {model.name or '(none)'!r} is not in the profile table; assuming "
                f"{model.input_limit:,} input tokens and an estimated tokenizer. Add it in the admin.",
            }
        )

    allowed_parts, tools_enabled = _mode_config(policy, mode)
    items: list[_Item] = []
    for part in system_parts or []:
        item = _Item(
            "system_part",
            "system",
            f"system:{part.name}",
            [{"role": "system", "content": part.content}],
            critical=part.critical,
            required=True,
        )
        if allowed_parts is not None and part.name not in allowed_parts:
            item.included, item.required, item.reason = False, False, f"not used in mode {mode!r}"
        items.append(item)

    tools = list(tools or [])
    tools_item = None
    if tools:
        tools_item = _Item("tools", "tools", "tools", [], required=True, extra={"count": len(tools)})
        tools_item.tokens = counter.tools_tokens(tools)
        if not tools_enabled:
            tools_item.included, tools_item.required, tools_item.reason = (
                False,
                False,
                f"not used in mode {mode!r}",
            )

    facts = decay.facts_for_context(tenant=tenant, session=session)
    importance_score = {"high": 1.0, "medium": 0.6, "low": 0.3}
    for fact in facts:
        note = " (restated: it has not come up for a while)" if fact.restated else ""
        high = fact.importance == "high"
        items.append(
            _Item(
                "pinned_fact",
                "pinned_facts",
                fact.fact_id,
                [{"role": "system", "content": f"Pinned fact — {fact.key}{note}: {fact.content}"}],
                score=importance_score.get(fact.importance, 0.3),
                critical=high,
                required=high,
                extra={"importance": fact.importance, "restated": fact.restated},
            )
        )
    restated = [f for f in facts if f.restated]
    if restated:
        warnings.append(
            {
                "code": "restated_facts",
                "message": f"{len(restated)} decayed fact(s) restated at the start of the prompt.",
                "facts": [f.fact_id for f in restated],
            }
        )

    summary = Summary.objects.filter(session=session, is_current=True).first()
    covered = summary.covers_up_to_seq if summary else 0
    rows = _window_rows(session=session, after_seq=covered, window=policy.history_window)
    input_from_history = False
    input_seq: int | None = None
    if next_input and rows and rows[-1]["role"] == MessageRole.USER and rows[-1]["content"] == next_input:
        input_seq = rows[-1]["seq"]
        rows.pop()  # the agent appended the input before building: send it once, as the input
        input_from_history = True

    query = next_input or next((r["content"] for r in reversed(rows) if r["role"] == MessageRole.USER), "")
    memories = []
    if policy.memory_limit and policy.memory_max_chars:
        memories = retrieval.experiences_for_context(
            tenant=tenant,
            session=session,
            query=query,
            limit=policy.memory_limit,
            max_chars=policy.memory_max_chars,
        )
    used_chars = 0
    for rank, memory in enumerate(memories):
        item = _Item(
            "memory",
            "memories",
            memory.experience_id,
            [{"role": "system", "content": f"Relevant past experience: {memory.text}"}],
            score=round(memory.score, 4),
        )
        if rank >= policy.memory_limit or used_chars + len(memory.text) > policy.memory_max_chars:
            item.included, item.reason = False, "over the memory limit"
        else:
            used_chars += len(memory.text)
        items.append(item)

    if summary is not None:
        items.append(
            _Item(
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
        )

    previous_digest = _previous_digest_item(tenant=tenant, session=session)
    if previous_digest is not None:
        items.append(previous_digest)

    groups, orphans = history_groups(rows)
    for row in orphans:
        items.append(
            _Item(
                "history",
                "history",
                f"msg:{row['seq']}",
                [],
                included=False,
                reason="tool result whose call is outside the window",
                extra={"seq": row["seq"]},
            )
        )
    # the window: newest groups while their messages fit in history_window
    selected: list[list[dict[str, Any]]] = []
    count = 0
    for group in reversed(groups):
        if count + len(group) > policy.history_window:
            break
        selected.append(group)
        count += len(group)
    selected.reverse()
    outside = max(0, (session.message_seq - covered) - len(rows) - int(input_from_history)) + (
        sum(len(g) for g in groups) - count
    )
    history_units: list[list[_Item]] = []
    for group in selected:
        label = f"seq:{group[0]['seq']}-{group[-1]['seq']}" if len(group) > 1 else None
        unit = []
        for row in group:
            meta = row["metadata"] or {}
            unit.append(
                _Item(
                    "history",
                    "history",
                    f"msg:{row['seq']}",
                    [_history_message(row)],
                    group=label,
                    critical=bool(meta.get("critical") or meta.get("importance") == "high"),
                    extra={"seq": row["seq"], "role": row["role"]},
                )
            )
        history_units.append(unit)
        items.extend(unit)

    recall_policy = recall_policy_effective(tenant=tenant, overrides=recall)
    items.extend(
        _recall_step(
            tenant=tenant,
            session=session,
            policy=recall_policy,
            query=query,
            window_seqs={row["seq"] for group in selected for row in group}
            | ({input_seq} if input_seq is not None else set()),
            exclude_ids={i.id for i in items if i.kind in ("pinned_fact", "memory", "summary")},
            budget_tokens=budget,
            counter=counter,
        )
    )

    questions_text = []
    if open_questions:
        questions_text.append("Open questions:\n" + "\n".join(f"- {q}" for q in open_questions))
    if next_actions:
        questions_text.append("Next actions:\n" + "\n".join(f"- {a}" for a in next_actions))
    questions_item = None
    if questions_text:
        questions_item = _Item(
            "open_questions",
            "open_questions",
            "open_questions",
            [{"role": "system", "content": "\n\n".join(questions_text)}],
        )
        items.append(questions_item)

    if next_input or input_from_history:
        items.append(
            _Item(
                "input",
                "input",
                "input",
                [{"role": "user", "content": next_input}],
                required=True,
                critical=True,
            )
        )
    elif history_units:
        for item in history_units[-1]:  # no new input: the newest message is the input, never dropped
            item.required, item.reason = True, "included (newest message)"
        history_units = history_units[:-1]

    for item in items:
        if item.messages:
            item.tokens = sum(counter.message_tokens(m) for m in item.messages)

    tools_tokens = tools_item.tokens if tools_item is not None and tools_item.included else 0
    considered = [i for i in items if i.included]
    demand = tokens.REPLY_PRIMING + tools_tokens + sum(i.tokens for i in considered)
    minimal = tokens.REPLY_PRIMING + tools_tokens + sum(i.tokens for i in considered if i.required)
    if minimal > budget:
        by_component: dict[str, int] = {}
        for i in considered:
            if i.required:
                by_component[i.component] = by_component.get(i.component, 0) + i.tokens
        if tools_tokens:
            by_component["tools"] = tools_tokens
        raise PromptTooLong(
            f"Even the minimal context needs {minimal:,} tokens; the budget is {budget:,} "
            f"(input limit {input_limit:,} - output reserve {reserve:,}) "
            f"for {model.name or 'the default model'}.",
            details={
                "gate": "tokens",
                "minimal_tokens": minimal,
                "budget_tokens": budget,
                "input_limit": input_limit,
                "output_reserve": reserve,
                "components": by_component,
                "model": model.name,
            },
        )

    # fit: oldest history first (whole groups), then weakest memories, open questions, summary, facts
    total = demand
    history_dropped = 0
    drop_order: list[tuple[list[_Item], str]] = [
        (unit, "over budget: oldest history dropped first") for unit in history_units
    ]
    drop_order += [
        ([i], "over budget: weakest recalled item dropped")
        for i in sorted((i for i in considered if i.kind == "recall"), key=lambda i: i.score or 0)
    ]
    drop_order += [
        ([i], "over budget: weakest memory dropped")
        for i in sorted((i for i in considered if i.kind == "memory"), key=lambda i: i.score or 0)
    ]
    if questions_item is not None:
        drop_order.append(([questions_item], "over budget"))
    drop_order += [([i], "over budget") for i in considered if i.kind == "summary"]
    drop_order += [
        ([i], "over budget: less important fact dropped")
        for i in sorted(
            (i for i in considered if i.kind == "pinned_fact" and not i.required), key=lambda i: i.score or 0
        )
    ]
    for unit, reason in drop_order:
        if total <= budget:
            break
        if any(i.required or not i.included for i in unit):
            continue
        for i in unit:
            i.included, i.reason = False, reason
            total -= i.tokens
        if unit[0].kind == "history":
            history_dropped += len(unit)

    order = ["system_part", "pinned_fact", "memory", "summary", "history", "open_questions", "input"]
    order.insert(1 if recall_policy.position == "start" else order.index("input"), "recall")
    placed = sorted((i for i in items if i.included and i.messages), key=lambda i: order.index(i.kind))
    messages: list[dict[str, Any]] = []
    components = dict.fromkeys(COMPONENTS, 0)
    components["overhead"] = tokens.REPLY_PRIMING
    components["tools"] = tools_tokens
    offset = 0
    message_tokens_total = sum(i.tokens for i in placed) + tokens.REPLY_PRIMING
    for i in placed:
        i.offset = offset
        offset += i.tokens
        messages.extend(i.messages)
        components[i.component] += i.tokens
    prompt_tokens = sum(components.values())

    for i in placed:
        if not i.critical:
            continue
        position = (i.offset or 0) / message_tokens_total if message_tokens_total else 0.0
        i.extra["position"] = round(position, 4)
        # The new input always closes the prompt, however long it is: never "in the middle".
        i.extra["risky"] = i.kind != "input" and policy.middle_start <= position <= policy.middle_end
        if i.extra["risky"]:
            warnings.append(
                {
                    "code": "critical_in_middle",
                    "message": f"Critical {i.kind} {i.id} starts at token {i.offset:,} "
                    f"of {message_tokens_total:,} "
                    f"({position:.0%}), in the middle of the prompt where models attend least.",
                    "item": i.id,
                    "offset": i.offset,
                    "position": round(position, 4),
                }
            )
    if prompt_tokens >= policy.near_limit * budget:
        warnings.append(
            {
                "code": "near_limit",
                "message": f"The prompt uses {prompt_tokens:,} of {budget:,} budget tokens "
                f"({prompt_tokens / budget:.0%}).",
                "prompt_tokens": prompt_tokens,
                "budget_tokens": budget,
            }
        )
    if history_dropped:
        warnings.append(
            {
                "code": "history_dropped",
                "message": f"{history_dropped} history message(s) did not fit and were left out "
                "(oldest first).",
                "count": history_dropped,
            }
        )

    threshold_tokens = math.floor(policy.summarise_threshold * input_limit)
    utilisation = prompt_tokens / input_limit
    foldable_to = session.message_seq - policy.keep_verbatim
    queue_reason = ""
    if demand >= threshold_tokens:
        queue_reason = (
            f"the context reached {demand / input_limit:.0%} of the input window "
            f"(threshold {policy.summarise_threshold:.0%})"
        )
    elif history_dropped:
        queue_reason = "history had to be dropped to fit the budget"
    summarise = bool(queue_reason) and foldable_to > covered
    already_queued = False
    if queue_reason and not summarise:
        queue_reason += f"; nothing to fold (the latest {policy.keep_verbatim} messages stay verbatim)"
    elif summarise:
        # one job per burst of builds: a job queued in the last REQUEUE_AFTER seconds is still
        # on its way (the job is idempotent anyway; this only spares the queue)
        already_queued = BudgetSample.objects.filter(
            session=session, summarisation_queued=True, created_at__gte=timezone.now() - REQUEUE_AFTER
        ).exists()
        if already_queued:
            summarise = False
            queue_reason += "; a summarisation job was queued moments ago and has not landed yet"

    forecast = _forecast(
        session=session,
        demand=demand,
        threshold_tokens=threshold_tokens,
        budget=budget,
        history_items=[i for u in history_units for i in u],
    )

    manifest = {
        "items": ([tools_item.manifest()] if tools_item else []) + [i.manifest() for i in items],
        "total_tokens": prompt_tokens,
        "priming_tokens": tokens.REPLY_PRIMING,
        "history_outside_window": outside,
        "usage_correction": {"factor": round(usage_factor, 4), "reports": usage_reports},
        "counting": "3 tokens per message + role + content (+ name, tool_calls JSON, tool_call_id) "
        "+ 3 reply priming + compact JSON of tool schemas",
    }
    budget_out = {
        "components": components,
        "prompt_tokens": prompt_tokens,
        "demand_tokens": demand,
        "input_limit": input_limit,
        "output_reserve": reserve,
        "budget_tokens": budget,
        "remaining_tokens": budget - prompt_tokens,
        "threshold_tokens": threshold_tokens,
        "utilisation": round(utilisation, 4),
        "exact": counter.exact,
        "tokenizer": counter.tokenizer,
        "estimate_factor": counter.factor if not counter.exact else None,
    }
    included_facts = [i.id for i in items if i.kind == "pinned_fact" and i.included]
    dropped_facts = [i.id for i in items if i.kind == "pinned_fact" and not i.included]
    included_memories = [i.id for i in items if i.kind == "memory" and i.included]

    with transaction.atomic():
        sample = BudgetSample.objects.create(
            tenant=tenant,
            session=session,
            model_name=model.name,
            tokenizer=counter.tokenizer,
            exact=counter.exact,
            prompt_tokens=prompt_tokens,
            demand_tokens=demand,
            input_limit=input_limit,
            output_reserve=reserve,
            threshold_tokens=threshold_tokens,
            utilisation=utilisation,
            components=components,
            manifest=manifest,
            warnings=warnings,
            forecast=forecast,
            summarisation_queued=summarise,
        )
        decay_warnings = decay.facts_after_build(
            tenant=tenant,
            session=session,
            included_fact_ids=included_facts,
            dropped_fact_ids=dropped_facts,
            prompt_text="\n".join(tokens.content_text(m.get("content")) for m in messages),
        )
        for text in decay_warnings or []:
            warnings.append({"code": "decay", "message": str(text)})
        if decay_warnings:
            sample.warnings = warnings
            sample.save(update_fields=["warnings"])
        if included_memories:
            retrieval.experiences_mark_used(tenant=tenant, experience_ids=included_memories)
        recorder.event_append(
            tenant=tenant,
            type="context.built",
            session=session,
            payload={
                "build_id": sample.public_id,
                "gen_ai.request.model": model.name,
                "prompt_tokens": prompt_tokens,
                "input_limit": input_limit,
                "utilisation": round(utilisation, 4),
                "components": components,
                "warnings": [w["code"] for w in warnings],
                "summarisation_queued": summarise,
            },
        )
        if summarise:
            from memory.services import jobs

            jobs.job_enqueue(
                tenant=tenant,
                kind=jobs.SUMMARISE,
                key=f"session:{session.pk}",
                payload={"session": session.pk},
            )

    return BuiltContext(
        build_id=sample.public_id,
        model=model.as_dict(),
        messages=messages,
        tools=tools if tools_item is not None and tools_item.included else [],
        manifest=manifest,
        budget=budget_out,
        warnings=warnings,
        forecast=forecast,
        summarisation={
            "queued": summarise,
            "already_queued": already_queued,
            "reason": queue_reason,
            "threshold": policy.summarise_threshold,
            "covered_up_to_seq": covered,
        },
        policy={**policy.as_dict(), "mode": mode, "recall": recall_policy.as_dict()},
    )


def _recall_step(
    *,
    tenant: Tenant,
    session: Session,
    policy: RecallPolicy,
    query: str,
    window_seqs: set[int],
    exclude_ids: set[str],
    budget_tokens: int,
    counter: tokens.TokenCounter,
) -> list[_Item]:
    """The `recall` component: items from outside the window relevant to the query (manifest
    entries carry their score and why they were chosen). Read-only."""
    recalled = context_recall(
        tenant=tenant,
        session=session,
        policy=policy,
        query=query,
        window_seqs=window_seqs,
        exclude_ids=exclude_ids,
        budget_tokens=budget_tokens,
        count_tokens=lambda text: counter.message_tokens({"role": "system", "content": text}),
    )
    return [
        _Item(
            "recall",
            "recall",
            f"recall:{item.kind}:{item.id}",
            [{"role": "system", "content": item.text}],
            score=round(item.score, 4),
            reason=item.reason,
            extra={
                "source": item.kind,
                "source_id": item.id,
                "session": item.session,
                "seq": item.seq,
                "occurred_at": item.occurred_at,
                "contributions": item.contributions,
            },
        )
        for item in recalled
    ]


def _forecast(
    *, session: Session, demand: int, threshold_tokens: int, budget: int, history_items: list[_Item]
) -> dict[str, Any]:
    """Turns until the summarisation threshold and until the budget, from the growth of the
    session's recent builds (demand tokens per build ≈ per turn), or — with fewer than two
    builds — from the tokens per user turn in the current window."""
    previous = list(
        BudgetSample.objects.filter(session=session)
        .order_by("-created_at")
        .values_list("demand_tokens", flat=True)[:9]
    )
    series = [*reversed(previous), demand]
    if len(series) >= 2:
        growth, basis = (series[-1] - series[0]) / (len(series) - 1), "builds"
    else:
        turns = sum(1 for i in history_items if i.extra.get("role") == MessageRole.USER) or 1
        growth, basis = sum(i.tokens for i in history_items) / turns, "history"

    def turns_until(limit: int) -> int | None:
        if demand >= limit:
            return 0
        return math.ceil((limit - demand) / growth) if growth > 0 else None

    return {
        "growth_tokens_per_turn": round(growth, 1),
        "basis": basis,
        "turns_until_summarisation": turns_until(threshold_tokens),
        "turns_until_window": turns_until(budget),
    }


def budget_samples_list(*, tenant: Tenant, session: Session, limit: int = 50) -> list[BudgetSample]:
    """The session's latest builds, newest first. Read-only."""
    return list(BudgetSample.objects.filter(tenant=tenant, session=session).order_by("-created_at")[:limit])


# --- provider usage ---------------------------------------------------------------------------------


def context_usage_record(
    *,
    tenant: Tenant,
    session: Session,
    build_id: str | None,
    input_tokens: int,
    output_tokens: int | None = None,
    cached_input_tokens: int | None = None,
    reasoning_tokens: int | None = None,
) -> TokenUsageReport:
    """Record the provider's usage for a built context (the session's latest build when
    `build_id` is None) next to our count of it; later estimates for that model are corrected by
    the median actual ÷ estimated ratio (model_profiles.usage_correction). Records
    `usage.reported`. Not idempotent by itself (use an Idempotency-Key). Raises NotFound for an
    unknown build; InvalidInput when cached or reasoning tokens are inconsistent."""
    builds = BudgetSample.objects.filter(tenant=tenant, session=session)
    sample = builds.filter(public_id=build_id).first() if build_id else builds.order_by("-created_at").first()
    if sample is None:
        raise NotFound.of("context build", build_id or "(latest)")
    if cached_input_tokens is not None and cached_input_tokens > input_tokens:
        raise InvalidInput(
            "Cached input tokens are part of the input tokens and cannot exceed them.",
            details={
                "fields": {"gen_ai.usage.cache_read.input_tokens": ["Exceeds gen_ai.usage.input_tokens."]}
            },
        )
    applied = float((sample.manifest or {}).get("usage_correction", {}).get("factor", 1.0)) or 1.0
    estimated = max(1, round(sample.prompt_tokens / applied)) if not sample.exact else sample.prompt_tokens
    with transaction.atomic():
        report = TokenUsageReport.objects.create(
            tenant=tenant,
            session=session,
            budget_sample=sample,
            model_name=sample.model_name,
            tokenizer=sample.tokenizer,
            estimated_input_tokens=estimated,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cached_input_tokens=cached_input_tokens,
            reasoning_tokens=reasoning_tokens,
        )
        recorder.event_append(
            tenant=tenant,
            type="usage.reported",
            session=session,
            payload={
                "build_id": sample.public_id,
                "gen_ai.request.model": sample.model_name,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                "gen_ai.usage.cache_read.input_tokens": cached_input_tokens,
                "gen_ai.usage.reasoning.output_tokens": reasoning_tokens,
                "estimated_input_tokens": estimated,
            },
        )
    return report
