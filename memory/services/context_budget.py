"""The pure steps of the context pipeline: count, fit to the budget, place and warn, decide on
summarisation, forecast. No queries: each step takes dataclasses (and plain numbers) and returns
one, so each can be tested alone.

Counting: every number comes from one TokenCounter (memory.services.tokens): each message costs
3 + tokens(role) + tokens(content) [+ 1 + tokens(name)] [+ tokens(tool_calls JSON)]
[+ tokens(tool_call_id)], a prompt adds 3 reply-priming tokens and the compact JSON of its tool
schemas. So the manifest's total is exactly the count of the returned prompt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memory.exceptions import InvalidInput, PromptTooLong
from memory.models import MessageRole
from memory.services import tokens
from memory.services.context_items import Candidates, ContextItem
from memory.services.context_policy import EffectivePolicy
from memory.services.model_profiles import ResolvedModel

COMPONENTS = (
    "system",
    "tools",
    "user_profile",
    "pinned_facts",
    "memories",
    "recall",
    "summary",
    "history",
    "open_questions",
    "input",
    "overhead",
)
PLACEMENT_ORDER = (
    "system_part",
    "user_profile",
    "pinned_fact",
    "memory",
    "summary",
    "history",
    "open_questions",
    "input",
)


@dataclass(frozen=True)
class Limits:
    input_limit: int
    reserve: int
    budget: int  # input_limit - reserve: what the prompt may use


@dataclass(frozen=True)
class Demand:
    total: int  # every included candidate, before fitting
    minimal: int  # only the required ones


@dataclass
class Placement:
    placed: list[ContextItem]  # included items in prompt order, with their offsets
    messages: list[dict[str, Any]]
    components: dict[str, int]
    prompt_tokens: int
    message_tokens: int  # the messages and the reply priming (tool schemas are not positioned)


@dataclass(frozen=True)
class SummarisationDecision:
    queued: bool
    already_queued: bool
    reason: str
    threshold_tokens: int


def input_check(next_input: str, policy: EffectivePolicy) -> None:
    """Raise InvalidInput for text no store accepts, PromptTooLong past the character gate."""
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
            f"The input has {len(next_input):,} characters; the character gate allows {policy.char_gate:,}. "
            "The policy field `char_gate` sets it (0 turns it off): for this build "
            '`"budget": {"char_gate": …}`, for the session PUT /api/v1/sessions/{id}/context-policy, for '
            "the tenant its context policy in the admin.",
            details={
                "gate": "characters",
                "input_chars": len(next_input),
                "char_gate": policy.char_gate,
                "policy_field": "char_gate",
            },
        )


def limits_resolve(model: ResolvedModel, policy: EffectivePolicy) -> Limits:
    """The token budget; InvalidInput when the output reserve leaves no room."""
    input_limit = min(model.input_limit, policy.max_input_tokens or model.input_limit)
    reserve = min(policy.output_reserve, model.output_limit)
    if input_limit - reserve <= 0:
        raise InvalidInput(
            f"The output reserve ({reserve:,}) leaves no room in the input limit ({input_limit:,}).",
            details={"fields": {"budget.output_reserve": ["Must be below the model's input limit."]}},
        )
    return Limits(input_limit=input_limit, reserve=reserve, budget=input_limit - reserve)


def model_warnings(model: ResolvedModel) -> list[dict[str, Any]]:
    if model.known:
        return []
    assumed = f"{model.input_limit:,} input tokens and an estimated tokenizer"
    if not model.name:
        return [
            {
                "code": "unknown_model",  # the same stable code: the build assumed a default
                "message": f"No model was set (not in the request, nor on the session, nor as the "
                f"context policy's default_model): the build assumed the default of {assumed} "
                "(CTXAPP_UNKNOWN_MODEL_INPUT_TOKENS). Name the model on the session or the request.",
            }
        ]
    return [
        {
            "code": "unknown_model",
            "message": f"Model {model.name!r} is not in the profile table; assuming {assumed}. "
            "Add it in the admin.",
        }
    ]


def candidates_count(candidates: Candidates, counter: tokens.TokenCounter) -> Demand:
    """Count every candidate's messages (sets `tokens`); the demand of all and of the required."""
    for item in candidates.items:
        if item.messages:
            item.tokens = sum(counter.message_tokens(m) for m in item.messages)
    fixed = tokens.REPLY_PRIMING + candidates.tools_tokens
    considered = [i for i in candidates.items if i.included]
    return Demand(
        total=fixed + sum(i.tokens for i in considered),
        minimal=fixed + sum(i.tokens for i in considered if i.required),
    )


def minimal_check(candidates: Candidates, demand: Demand, limits: Limits, model: ResolvedModel) -> None:
    """PromptTooLong when even the required items exceed the budget, by component."""
    if demand.minimal <= limits.budget:
        return
    by_component: dict[str, int] = {}
    for i in candidates.items:
        if i.included and i.required:
            by_component[i.component] = by_component.get(i.component, 0) + i.tokens
    if candidates.tools_tokens:
        by_component["tools"] = candidates.tools_tokens
    raise PromptTooLong(
        f"Even the minimal context needs {demand.minimal:,} tokens; the budget is {limits.budget:,} "
        f"(input limit {limits.input_limit:,} - output reserve {limits.reserve:,}) "
        f"for {model.name or 'the default model'}. The policy field `output_reserve` (or "
        "`max_input_tokens`, for a build or a session) changes the budget; a model with a larger input "
        "limit does too.",
        details={
            "gate": "tokens",
            "minimal_tokens": demand.minimal,
            "budget_tokens": limits.budget,
            "input_limit": limits.input_limit,
            "output_reserve": limits.reserve,
            "components": by_component,
            "model": model.name,
            "policy_field": "output_reserve",
        },
    )


def _by_score(items: list[ContextItem]) -> list[ContextItem]:
    return sorted(items, key=lambda i: i.score or 0)


def drop_order(candidates: Candidates) -> list[tuple[list[ContextItem], str]]:
    """Units in the order they give way: oldest history (whole groups), weakest recalled items,
    weakest memories, open questions, the summary, the user profile, less important facts."""
    considered = [i for i in candidates.items if i.included]
    order: list[tuple[list[ContextItem], str]] = [
        (unit, "over budget: oldest history dropped first") for unit in candidates.history_units
    ]
    order += [
        ([i], "over budget: weakest recalled item dropped")
        for i in _by_score([i for i in considered if i.kind == "recall"])
    ]
    order += [
        ([i], "over budget: weakest memory dropped")
        for i in _by_score([i for i in considered if i.kind == "memory"])
    ]
    if candidates.questions is not None:
        order.append(([candidates.questions], "over budget"))
    order += [([i], "over budget") for i in considered if i.kind == "summary"]
    order += [
        ([i], "over budget: the user's memories dropped") for i in considered if i.kind == "user_profile"
    ]
    order += [
        ([i], "over budget: less important fact dropped")
        for i in _by_score([i for i in considered if i.kind == "pinned_fact" and not i.required])
    ]
    return order


def budget_fit(candidates: Candidates, *, demand: int, budget: int) -> int:
    """Drop units in `drop_order` until the prompt fits; required items stay. Returns how many
    history messages were dropped."""
    total = demand
    history_dropped = 0
    for unit, reason in drop_order(candidates):
        if total <= budget:
            break
        if any(i.required or not i.included for i in unit):
            continue
        for i in unit:
            i.included, i.reason = False, reason
            total -= i.tokens
        if unit[0].kind == "history":
            history_dropped += len(unit)
    return history_dropped


def items_place(candidates: Candidates) -> Placement:
    """Order the included items for the U-shaped attention curve and give each its offset."""
    order = list(PLACEMENT_ORDER)
    order.insert(1 if candidates.recall_policy.position == "start" else order.index("input"), "recall")
    placed = sorted(
        (i for i in candidates.items if i.included and i.messages), key=lambda i: order.index(i.kind)
    )
    messages: list[dict[str, Any]] = []
    components = dict.fromkeys(COMPONENTS, 0)
    components["overhead"] = tokens.REPLY_PRIMING
    components["tools"] = candidates.tools_tokens
    offset = 0
    for i in placed:
        i.offset = offset
        offset += i.tokens
        messages.extend(i.messages)
        components[i.component] += i.tokens
    return Placement(
        placed=placed,
        messages=messages,
        components=components,
        prompt_tokens=sum(components.values()),
        message_tokens=offset + tokens.REPLY_PRIMING,
    )


def critical_positions(placement: Placement, policy: EffectivePolicy) -> list[dict[str, Any]]:
    """Mark each critical item's position (0 = start, 1 = end) and whether it sits in the
    policy's middle band, where models attend least; a warning for each that does."""
    warnings = []
    total = placement.message_tokens
    for i in placement.placed:
        if not i.critical:
            continue
        position = (i.offset or 0) / total if total else 0.0
        i.extra["position"] = round(position, 4)
        # The new input always closes the prompt, however long it is: never "in the middle".
        i.extra["risky"] = i.kind != "input" and policy.middle_start <= position <= policy.middle_end
        if i.extra["risky"]:
            warnings.append(
                {
                    "code": "critical_in_middle",
                    "message": f"Critical {i.kind} {i.id} starts at token {i.offset:,} of {total:,} "
                    f"({position:.0%}), in the middle of the prompt where models attend least.",
                    "item": i.id,
                    "offset": i.offset,
                    "position": round(position, 4),
                }
            )
    return warnings


def fit_warnings(
    *, prompt_tokens: int, budget: int, near_limit: float, history_dropped: int
) -> list[dict[str, Any]]:
    warnings = []
    if prompt_tokens >= near_limit * budget:
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
    return warnings


def summarisation_decide(
    *,
    policy: EffectivePolicy,
    demand: int,
    input_limit: int,
    history_dropped: int,
    foldable_to: int,
    covered: int,
    recently_queued: Callable[[], bool],
) -> SummarisationDecision:
    """Queue summarisation when the demand reaches the threshold or history was dropped, and
    there is something to fold past the verbatim tail. `recently_queued` is asked only then: one
    job per burst of builds (the job is idempotent anyway; this only spares the queue)."""
    threshold_tokens = math.floor(policy.summarise_threshold * input_limit)
    reason = ""
    if demand >= threshold_tokens:
        reason = (
            f"the context reached {demand / input_limit:.0%} of the input window "
            f"(threshold {policy.summarise_threshold:.0%})"
        )
    elif history_dropped:
        reason = "history had to be dropped to fit the budget"
    queued = bool(reason) and foldable_to > covered
    already_queued = False
    if reason and not queued:
        reason += f"; nothing to fold (the latest {policy.keep_verbatim} messages stay verbatim)"
    elif queued and recently_queued():
        queued, already_queued = False, True
        reason += "; a summarisation job was queued moments ago and has not landed yet"
    return SummarisationDecision(
        queued=queued, already_queued=already_queued, reason=reason, threshold_tokens=threshold_tokens
    )


def forecast_compute(
    *,
    previous_demands: Sequence[int],
    demand: int,
    threshold_tokens: int,
    budget: int,
    history_items: list[ContextItem],
) -> dict[str, Any]:
    """Turns until the summarisation threshold and until the budget, from the growth over the
    previous builds' demands (oldest first; ≈ per turn), or — with no previous build — from the
    tokens per user turn in the current window."""
    series = [*previous_demands, demand]
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
