"""The pure steps of the context pipeline, each on its own (no database)."""

from __future__ import annotations

from dataclasses import replace

from memory.services import tokens
from memory.services.context_budget import (
    budget_fit,
    candidates_count,
    critical_positions,
    items_place,
    summarisation_decide,
)
from memory.services.context_items import Candidates, ContextItem
from memory.services.context_policy import EffectivePolicy
from memory.services.context_recall import RecallPolicy

POLICY = EffectivePolicy(
    history_window=30,
    summarise_threshold=0.85,
    keep_verbatim=5,
    output_reserve=0,
    char_gate=0,
    memory_limit=5,
    memory_max_chars=2000,
    near_limit=0.9,
    middle_start=0.3,
    middle_end=0.7,
    mode="default",
    summary_max_tokens=500,
    user_profile_share=0.1,
    user_profile_max_tokens=1000,
    max_input_tokens=None,
    mode_parts={"default": {}},
    default_model="",
)
RECALL = RecallPolicy(
    enabled=False, top_k=0, min_score=0.0, min_similarity=0.0, position="end", budget_share=0.0
)


def _item(kind: str, id: str, *, required: bool = False, critical: bool = False, score: float | None = None):
    component = {"system_part": "system", "pinned_fact": "pinned_facts", "memory": "memories"}.get(kind, kind)
    role = "user" if kind == "input" else "system"
    content = f"{id}: " + "words " * 40
    return ContextItem(
        kind,
        component,
        id,
        [{"role": role, "content": content}],
        required=required,
        critical=critical,
        score=score,
    )


def _candidates(items: list[ContextItem], units: list[list[ContextItem]]) -> Candidates:
    return Candidates(
        items=items,
        tools=None,
        history_units=units,
        questions=None,
        recall_policy=RECALL,
        covered=0,
        outside=0,
        warnings=[],
    )


def test_fit_drops_the_oldest_history_first_whole_groups_and_keeps_required_items():
    rules = _item("system_part", "system:rules", required=True)
    fact = _item("pinned_fact", "fact_1", required=True, critical=True, score=1.0)
    memory = _item("memory", "exp_1", score=0.9)
    old_call = [_item("history", "msg:1"), _item("history", "msg:2")]  # a tool call and its result
    newer = [_item("history", "msg:3")]
    newest = [_item("history", "msg:4")]
    question = _item("input", "input", required=True, critical=True)
    items = [rules, fact, memory, *old_call, *newer, *newest, question]
    candidates = _candidates(items, [old_call, newer, newest])
    counter = tokens.TokenCounter(tokens.DEFAULT_ENCODING, 1.0)
    demand = candidates_count(candidates, counter)
    per_item = rules.tokens
    assert all(i.tokens > 40 for i in items)

    # room for everything but about two items: the oldest group goes, whole, and nothing else
    dropped = budget_fit(candidates, demand=demand.total, budget=demand.total - per_item)
    assert dropped == 2
    assert [i.id for i in items if not i.included] == ["msg:1", "msg:2"]
    assert {i.reason for i in old_call} == {"over budget: oldest history dropped first"}

    # a budget of the required items only: all history and the memory go, the required stay
    candidates = _candidates(items, [old_call, newer, newest])
    for i in items:
        i.included, i.reason = True, "included"
    dropped = budget_fit(candidates, demand=demand.total, budget=demand.minimal)
    assert dropped == 4
    assert [i.id for i in items if i.included] == ["system:rules", "fact_1", "input"]
    assert memory.reason == "over budget: weakest memory dropped"


def test_place_orders_for_the_attention_curve_and_flags_critical_items_in_the_policys_middle():
    history = [_item("history", f"msg:{n}") for n in range(1, 5)]
    critical_msg = history[1]
    critical_msg.critical = True
    items = [
        *history,
        _item("input", "input", required=True, critical=True),
        _item("system_part", "system:a"),
    ]
    candidates = _candidates(items, [[h] for h in history])
    candidates_count(candidates, tokens.TokenCounter(tokens.DEFAULT_ENCODING, 1.0))

    placement = items_place(candidates)
    assert [i.id for i in placement.placed] == ["system:a", "msg:1", "msg:2", "msg:3", "msg:4", "input"]
    assert placement.prompt_tokens == placement.message_tokens == sum(i.tokens for i in items) + 3

    # msg:2 starts about 2/6 of the way in: inside 30-70 %, outside a band of 50-70 %
    warnings = critical_positions(placement, POLICY)
    assert [w["item"] for w in warnings] == ["msg:2"] and critical_msg.extra["risky"] is True
    assert 0.3 < critical_msg.extra["position"] < 0.4
    assert critical_positions(placement, replace(POLICY, middle_start=0.5)) == []
    assert critical_msg.extra["risky"] is False
    assert items[4].extra == {
        "position": round(items[4].offset / placement.message_tokens, 4),
        "risky": False,
    }


def test_summarisation_asks_for_recent_jobs_only_when_it_would_queue():
    asked = []

    def recently_queued() -> bool:
        asked.append(True)
        return True

    below = summarisation_decide(
        policy=POLICY,
        demand=100,
        input_limit=1000,
        history_dropped=0,
        foldable_to=50,
        covered=0,
        recently_queued=recently_queued,
    )
    assert (below.queued, below.reason, below.threshold_tokens, asked) == (False, "", 850, [])
    nothing_to_fold = summarisation_decide(
        policy=POLICY,
        demand=900,
        input_limit=1000,
        history_dropped=0,
        foldable_to=10,
        covered=10,
        recently_queued=recently_queued,
    )
    assert not nothing_to_fold.queued and "nothing to fold" in nothing_to_fold.reason and asked == []
    again = summarisation_decide(
        policy=POLICY,
        demand=100,
        input_limit=1000,
        history_dropped=3,
        foldable_to=50,
        covered=0,
        recently_queued=recently_queued,
    )
    assert (again.queued, again.already_queued, asked) == (False, True, [True])
    assert again.reason.startswith("history had to be dropped")
