"""Leave-one-conversation-out for `ctxapp eval recall --loo`: each conversation is scored with
the ranking plan and the recall cut chosen on the OTHER conversations, beside every setting's
in-sample figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KS = (1, 5, 10)
# The settings `--loo` chooses among: ranking plans (POST /memory/search `plan`) and recall cuts
# (POST /sessions/{id}/context `recall`). The first of each is the server's default.
LOO_PLANS: tuple[dict[str, Any], ...] = (
    {},
    {"session_weight": 0.1},
    {"prf_docs": 3},
    {"neighbour_weight": 0.6},
)
LOO_RECALL: tuple[dict[str, Any], ...] = (
    {},
    {"top_k": 8},
    {"top_k": 10},
    {"top_k": 12},
    {"top_k": 15},
    {"top_k": 20},
    {"top_k": 15, "relative_gap": 0.6},
    {"top_k": 20, "relative_gap": 0.5},
)
RECALLED_TOKENS_TARGET = 1000  # a recall cut is chosen only if its median recalled tokens stay under this


@dataclass
class Asked:
    """One question with evidence, under every setting asked: turn recall per plan (index into
    the plans) and, per recall cut, (fraction of its evidence in the prompt, recalled tokens,
    recalled items)."""

    conversation: int
    category: str
    recall: list[dict[int, float]]
    prompt: list[tuple[float, int, int]]
    bm25: dict[int, float]


def median(values: list[int]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    middle = len(ordered) // 2
    return float(ordered[middle]) if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _choose(train: list[Asked], *, plans: int, cuts: int) -> tuple[int, int]:
    """The plan with the best mean of R@5 and R@10 on `train`, and the cut with the most evidence
    in the prompt among those whose median recalled tokens stay ≤ RECALLED_TOKENS_TARGET (the
    default cut if none does)."""
    plan = max(range(plans), key=lambda p: (sum(a.recall[p][5] + a.recall[p][10] for a in train), -p))
    fitting = [c for c in range(cuts) if median([a.prompt[c][1] for a in train]) <= RECALLED_TOKENS_TARGET]
    cut = max(fitting or [0], key=lambda c: (sum(a.prompt[c][0] for a in train), -c))
    return plan, cut


def _in_sample(asked: list[Asked], *, plans: int, cuts: int) -> dict[str, Any]:
    return {
        "plans": [
            {"plan": LOO_PLANS[p], **{f"R@{k}": mean_pct([a.recall[p][k] for a in asked]) for k in (5, 10)}}
            for p in range(plans)
        ],
        "recall": [
            {
                "recall": LOO_RECALL[c],
                "evidence_in_prompt": mean_pct([a.prompt[c][0] for a in asked]),
                "recalled_tokens_median": median([a.prompt[c][1] for a in asked]),
            }
            for c in range(cuts)
        ],
    }


def leave_one_out(asked: list[Asked], *, conversations: int) -> dict[str, Any]:
    """Each conversation scored with the plan and the recall cut chosen on the others (`_choose`)."""
    held: list[tuple[dict[int, float], tuple[float, int, int]]] = []
    chosen: list[dict[str, Any]] = []
    plans, cuts = len(asked[0].recall) if asked else 1, len(asked[0].prompt) if asked else 1
    for number in range(conversations):
        train = [a for a in asked if a.conversation != number]
        test = [a for a in asked if a.conversation == number]
        if not test or not train:
            continue
        plan, cut = _choose(train, plans=plans, cuts=cuts)
        chosen.append({"conversation": number, "plan": LOO_PLANS[plan], "recall": LOO_RECALL[cut]})
        held += [(a.recall[plan], a.prompt[cut]) for a in test]
    if not held:
        return {}
    return {
        **{f"R@{k}": round(100 * sum(r[k] for r, _ in held) / len(held), 1) for k in KS},
        "evidence_in_prompt": round(100 * sum(p[0] for _, p in held) / len(held), 1),
        "recalled_tokens_median": median([p[1] for _, p in held]),
        "chosen": chosen,
        "in_sample": _in_sample(asked, plans=plans, cuts=cuts),
    }


def mean_pct(values: list[float]) -> float:
    return round(100 * sum(values) / len(values), 1) if values else 0.0
