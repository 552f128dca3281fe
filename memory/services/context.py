"""The context builder: "what do I send next?" for one session and the next input.

A build gathers, in placement order for the U-shaped attention curve: static system parts
(cache-friendly, first), pinned facts, retrieved memories, the rolling summary, the recent
history window, open questions / next actions, and the new input (last). It fits them to the
model's budget (input limit - output reserve) by dropping the oldest history first — tool-call
groups as a whole — then the weakest memories, open questions, the summary and the less
important facts; required parts (system parts of the mode, tools, high-importance facts, the
newest input) are never dropped. If even those exceed the gate → PromptTooLong.

`context_build` is a pipeline: resolve the policy and the model; collect the candidates
(context_candidates); count, fit, place and warn, decide on summarisation and forecast (pure
steps, context_budget); then one thin persist step. Counting rules: see context_budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.exceptions import InvalidInput, NotFound
from memory.models import BudgetSample, Session, Tenant, TokenUsageReport
from memory.services import decay, jobs, model_profiles, recorder, tokens
from memory.services import experience_search as retrieval
from memory.services.context_budget import (
    COMPONENTS,
    Demand,
    Limits,
    Placement,
    SummarisationDecision,
    budget_fit,
    candidates_count,
    critical_positions,
    fit_warnings,
    forecast_compute,
    input_check,
    items_place,
    limits_resolve,
    minimal_check,
    model_warnings,
    summarisation_decide,
)
from memory.services.context_candidates import candidates_collect
from memory.services.context_history import WINDOW_MARGIN, history_groups
from memory.services.context_items import BuildRequest, Candidates, ContextItem, SystemPart
from memory.services.context_policy import (
    POLICY_FIELDS,
    EffectivePolicy,
    context_policy_effective,
    context_policy_read,
    policy_overrides_validate,
    session_context_policy_set,
)
from memory.services.context_recall import RecallPolicy
from memory.services.model_profiles import ResolvedModel

__all__ = [
    "COMPONENTS",
    "POLICY_FIELDS",
    "REQUEUE_AFTER",
    "WINDOW_MARGIN",
    "BuildRequest",
    "BuiltContext",
    "ContextItem",
    "EffectivePolicy",
    "RecallPolicy",
    "ResolvedModel",
    "Summarisation",
    "SystemPart",
    "budget_samples_list",
    "context_build",
    "context_policy_effective",
    "context_policy_read",
    "context_usage_record",
    "history_groups",
    "policy_overrides_validate",
    "session_context_policy_set",
]

REQUEUE_AFTER = timedelta(seconds=60)
RECALLED_KINDS = ("recall", "memory")  # what ctxapp_retrieval_results_returned counts
FORECAST_BUILDS = 9  # previous builds the forecast's growth is measured over
COUNTING = (
    "3 tokens per message + role + content (+ name, tool_calls JSON, tool_call_id) "
    "+ 3 reply priming + compact JSON of tool schemas"
)


@dataclass(frozen=True)
class Summarisation:
    """What the build decided about summarising the session (memory/api/context_shapes.py renders it)."""

    queued: bool
    already_queued: bool
    reason: str
    threshold: float  # the policy's summarise_threshold, a share of the input limit
    covered_up_to_seq: int  # the current summary covers messages up to this seq (0: none)


@dataclass
class BuiltContext:
    """A built prompt. `manifest`, `budget`, `warnings` and `forecast` are the JSON documents the
    build also stores (BudgetSample), so they stay plain dicts; the API's BuiltContextSerializer
    describes their fields."""

    build_id: str
    model: ResolvedModel
    messages: list[dict[str, Any]]
    tools: list[Any]
    manifest: dict[str, Any]
    budget: dict[str, Any]
    warnings: list[dict[str, Any]]
    forecast: dict[str, Any]
    summarisation: Summarisation
    policy: EffectivePolicy
    recall_policy: RecallPolicy


@dataclass(frozen=True)
class Counting:
    model: ResolvedModel
    counter: tokens.TokenCounter
    usage_factor: float
    usage_reports: int


@dataclass
class Outcome:
    """What the pure steps decided; the persist step records it."""

    candidates: Candidates
    limits: Limits
    demand: Demand
    placement: Placement
    warnings: list[dict[str, Any]]
    summarisation: SummarisationDecision
    forecast: dict[str, Any]


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
    position, budget_share, query): see context_candidates and memory/services/context_recall.py.

    Not read-only: records a BudgetSample and a `context.built` event (one transaction), tells
    decay and retrieval what the prompt carried, and — when the prompt reaches the summarisation
    threshold or history had to be dropped — enqueues summarisation after commit. Not idempotent
    (each call is a new build). Raises PromptTooLong when the new input exceeds the character gate
    or the minimal context exceeds input limit - output reserve; InvalidInput for bad overrides.
    """
    policy = context_policy_effective(tenant=tenant, session=session, overrides=overrides)
    counting = _counting_resolve(tenant=tenant, session=session, policy=policy, model_name=model_name)
    request = BuildRequest(
        next_input=next_input or "",
        system_parts=list(system_parts or []),
        tools=list(tools or []),
        open_questions=list(open_questions or []),
        next_actions=list(next_actions or []),
        recall=recall,
    )
    input_check(request.next_input, policy)
    limits = limits_resolve(counting.model, policy)
    candidates = candidates_collect(
        tenant=tenant,
        session=session,
        policy=policy,
        counter=counting.counter,
        budget_tokens=limits.budget,
        request=request,
    )
    outcome = _outcome(
        session=session, policy=policy, counting=counting, limits=limits, candidates=candidates
    )
    return _persist(
        tenant=tenant, session=session, policy=policy, counting=counting, request=request, outcome=outcome
    )


def _counting_resolve(
    *, tenant: Tenant, session: Session, policy: EffectivePolicy, model_name: str
) -> Counting:
    """The model profile and the token counter, corrected by the provider's reported usage."""
    model = model_profiles.model_profile_resolve(
        tenant=tenant, name=model_name or session.model_name or policy.default_model
    )
    usage_factor, usage_reports = (
        (1.0, 0) if model.exact else model_profiles.usage_correction(tenant=tenant, model_name=model.name)
    )
    factor = (
        1.0
        if model.exact
        else tokens.clamp_factor(model_profiles.family_factor(model.tokenizer) * usage_factor)
    )
    return Counting(
        model=model,
        counter=tokens.TokenCounter(model.tokenizer, factor),
        usage_factor=usage_factor,
        usage_reports=usage_reports,
    )


def _outcome(
    *, session: Session, policy: EffectivePolicy, counting: Counting, limits: Limits, candidates: Candidates
) -> Outcome:
    """Count, fit, place and warn, decide on summarisation, forecast. Reads only the session's
    previous builds (for the forecast and the requeue guard)."""
    demand = candidates_count(candidates, counting.counter)
    minimal_check(candidates, demand, limits, counting.model)
    history_dropped = budget_fit(candidates, demand=demand.total, budget=limits.budget)
    placement = items_place(candidates)
    warnings = model_warnings(counting.model) + candidates.warnings
    warnings += critical_positions(placement, policy)
    warnings += fit_warnings(
        prompt_tokens=placement.prompt_tokens,
        budget=limits.budget,
        near_limit=policy.near_limit,
        history_dropped=history_dropped,
    )
    decision = summarisation_decide(
        policy=policy,
        demand=demand.total,
        input_limit=limits.input_limit,
        history_dropped=history_dropped,
        foldable_to=session.message_seq - policy.keep_verbatim,
        covered=candidates.covered,
        recently_queued=lambda: _summarisation_recently_queued(session),
    )
    forecast = forecast_compute(
        previous_demands=_previous_demands(session),
        demand=demand.total,
        threshold_tokens=decision.threshold_tokens,
        budget=limits.budget,
        history_items=[i for unit in candidates.history_units for i in unit],
    )
    return Outcome(candidates, limits, demand, placement, warnings, decision, forecast)


def _summarisation_recently_queued(session: Session) -> bool:
    """A job queued in the last REQUEUE_AFTER seconds is still on its way."""
    return BudgetSample.objects.filter(
        session=session, summarisation_queued=True, created_at__gte=timezone.now() - REQUEUE_AFTER
    ).exists()


def _previous_demands(session: Session) -> list[int]:
    """The demand of the session's latest builds, oldest first."""
    previous = list(
        BudgetSample.objects.filter(session=session)
        .order_by("-created_at")
        .values_list("demand_tokens", flat=True)[:FORECAST_BUILDS]
    )
    return previous[::-1]


def _manifest(counting: Counting, outcome: Outcome) -> dict[str, Any]:
    candidates = outcome.candidates
    return {
        "items": ([candidates.tools.manifest()] if candidates.tools else [])
        + [i.manifest() for i in candidates.items],
        "total_tokens": outcome.placement.prompt_tokens,
        "priming_tokens": tokens.REPLY_PRIMING,
        "history_outside_window": candidates.outside,
        "usage_correction": {"factor": round(counting.usage_factor, 4), "reports": counting.usage_reports},
        "counting": COUNTING,
    }


def _budget(counting: Counting, outcome: Outcome) -> dict[str, Any]:
    limits, placement, counter = outcome.limits, outcome.placement, counting.counter
    return {
        "components": placement.components,
        "prompt_tokens": placement.prompt_tokens,
        "demand_tokens": outcome.demand.total,
        "input_limit": limits.input_limit,
        "output_reserve": limits.reserve,
        "budget_tokens": limits.budget,
        "remaining_tokens": limits.budget - placement.prompt_tokens,
        "threshold_tokens": outcome.summarisation.threshold_tokens,
        "utilisation": round(placement.prompt_tokens / limits.input_limit, 4),
        "exact": counter.exact,
        "tokenizer": counter.tokenizer,
        "estimate_factor": counter.factor if not counter.exact else None,
    }


def _persist(
    *,
    tenant: Tenant,
    session: Session,
    policy: EffectivePolicy,
    counting: Counting,
    request: BuildRequest,
    outcome: Outcome,
) -> BuiltContext:
    """Record the build (BudgetSample, decay and retrieval bookkeeping, `context.built`) in one
    transaction; enqueue summarisation after commit when decided."""
    candidates, placement, decision = outcome.candidates, outcome.placement, outcome.summarisation
    manifest = _manifest(counting, outcome)
    budget = _budget(counting, outcome)
    warnings = outcome.warnings
    facts = candidates.of_kind("pinned_fact")
    with transaction.atomic():
        sample = BudgetSample.objects.create(
            tenant=tenant,
            session=session,
            model_name=counting.model.name,
            tokenizer=counting.counter.tokenizer,
            exact=counting.counter.exact,
            prompt_tokens=placement.prompt_tokens,
            demand_tokens=outcome.demand.total,
            input_limit=outcome.limits.input_limit,
            output_reserve=outcome.limits.reserve,
            threshold_tokens=decision.threshold_tokens,
            utilisation=placement.prompt_tokens / outcome.limits.input_limit,
            components=placement.components,
            manifest=manifest,
            warnings=warnings,
            forecast=outcome.forecast,
            summarisation_queued=decision.queued,
            recalled_items=sum(i.included and i.kind in RECALLED_KINDS for i in candidates.items),
        )
        decay_warnings = decay.facts_after_build(
            tenant=tenant,
            session=session,
            included_fact_ids=[i.id for i in facts if i.included],
            dropped_fact_ids=[i.id for i in facts if not i.included],
            prompt_text="\n".join(tokens.content_text(m.get("content")) for m in placement.messages),
        )
        for text in decay_warnings or []:
            warnings.append({"code": "decay", "message": str(text)})
        if decay_warnings:
            sample.warnings = warnings
            sample.save(update_fields=["warnings"])
        included_memories = [i.id for i in candidates.of_kind("memory") if i.included]
        if included_memories:
            # After commit, on its own: the build's transaction locks no experience row. Locked
            # here, before the agent's event stream below, a worker job that held the stream
            # and then locked the same experience deadlocked with the build (a 503).
            transaction.on_commit(
                partial(retrieval.experiences_mark_used, tenant=tenant, experience_ids=included_memories),
                robust=True,  # a use count that failed to land is logged, never the build's error
            )
        recorder.event_append(
            tenant=tenant,
            type="context.built",
            session=session,
            payload={
                "build_id": sample.public_id,
                "gen_ai.request.model": counting.model.name,
                "prompt_tokens": placement.prompt_tokens,
                "input_limit": outcome.limits.input_limit,
                "utilisation": budget["utilisation"],
                "components": placement.components,
                "warnings": [w["code"] for w in warnings],
                "summarisation_queued": decision.queued,
            },
        )
        if decision.queued:
            _summarisation_enqueue(tenant=tenant, session=session)

    tools_item = candidates.tools
    return BuiltContext(
        build_id=sample.public_id,
        model=counting.model,
        messages=placement.messages,
        tools=request.tools if tools_item is not None and tools_item.included else [],
        manifest=manifest,
        budget=budget,
        warnings=warnings,
        forecast=outcome.forecast,
        summarisation=Summarisation(
            queued=decision.queued,
            already_queued=decision.already_queued,
            reason=decision.reason,
            threshold=policy.summarise_threshold,
            covered_up_to_seq=candidates.covered,
        ),
        policy=policy,
        recall_policy=candidates.recall_policy,
    )


def _summarisation_enqueue(*, tenant: Tenant, session: Session) -> None:
    """Record the session's summarisation job in the build's transaction (the jobs outbox)."""
    jobs.job_enqueue(
        tenant=tenant, kind=jobs.SUMMARISE, key=f"session:{session.pk}", payload={"session": session.pk}
    )


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
    payload = {  # the report in OpenTelemetry GenAI names, with our estimate
        "build_id": sample.public_id,
        "gen_ai.request.model": sample.model_name,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": cached_input_tokens,
        "gen_ai.usage.reasoning.output_tokens": reasoning_tokens,
        "estimated_input_tokens": estimated,
    }
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
        recorder.event_append(tenant=tenant, type="usage.reported", session=session, payload=payload)
    return report
