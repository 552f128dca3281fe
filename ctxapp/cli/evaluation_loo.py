"""Leave-one-conversation-out for `ctxapp eval recall --loo`: each conversation is scored with
the ranking plan and the recall cut chosen on the OTHER conversations, beside every setting's
in-sample figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

KS = (1, 5, 10)
# The settings `--loo` chooses among: ranking plans (POST /memory/search `plan`) and recall cuts
# (POST /sessions/{id}/context `recall`). The first of each is the server's default.
# The plans are the components that were measured but not kept (docs/memory.md, "The ranker"):
# a file where one of them pays shows it in the held-out figures.
LOO_PLANS: tuple[dict[str, Any], ...] = (
    {},
    {"speaker_weight": 1.0},
    {"fusion": "minmax", "dense_weight": 0.7, "lexical_weight": 0.3, "neighbour_weight": 0.5},
    {"window_radius": 2},
)
# Recall cuts: how many turns (`top_k`) and how far under the best hit (`relative_gap`, z-score
# units of the pool, ranking.py) a build brings.
LOO_RECALL: tuple[dict[str, Any], ...] = (
    {},
    {"relative_gap": 2.0},
    {"relative_gap": 4.0},
    {"relative_gap": 6.0},
    {"top_k": 10, "relative_gap": 6.0},
    {"top_k": 15, "relative_gap": 4.0},
    {"top_k": 15, "relative_gap": 6.0},
    {"top_k": 20, "relative_gap": 6.0},
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
    baseline: dict[int, float] = field(default_factory=dict)  # the plain recipe (--baseline)


def bootstrap_ci(diff: list[float] | np.ndarray, *, seed: int = 0, draws: int = 10_000) -> list[float]:
    """[mean, 2.5th, 97.5th percentile] of the mean of paired differences, resampling them."""
    values = np.asarray(diff, dtype=np.float64)
    if not len(values):
        return [0.0, 0.0, 0.0]
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(draws, len(values)))].mean(axis=1)
    return [
        round(float(v), 1) for v in (values.mean(), np.percentile(means, 2.5), np.percentile(means, 97.5))
    ]


def versus_baseline(pairs: list[tuple[dict[int, float], dict[int, float]]]) -> dict[str, Any]:
    """ctxapp's recall minus the plain recipe's, per question (R@5, R@10), with its bootstrap CI."""
    if not pairs or not pairs[0][1]:
        return {}
    return {
        f"R@{k}": bootstrap_ci([100 * (ours[k] - base[k]) for ours, base in pairs], seed=k) for k in (5, 10)
    }


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
    """Nested leave-one-conversation-out: each conversation scored with the plan and the recall
    cut chosen on the others (`_choose`), never on itself; with --baseline, the held-out gain over
    the plain recipe per question and its paired bootstrap 95 % CI."""
    held: list[tuple[dict[int, float], tuple[float, int, int]]] = []
    against: list[tuple[dict[int, float], dict[int, float]]] = []
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
        against += [(a.recall[plan], a.baseline) for a in test]
    if not held:
        return {}
    return {
        **{f"R@{k}": round(100 * sum(r[k] for r, _ in held) / len(held), 1) for k in KS},
        "evidence_in_prompt": round(100 * sum(p[0] for _, p in held) / len(held), 1),
        "recalled_tokens_median": median([p[1] for _, p in held]),
        "chosen": chosen,
        "versus_baseline": versus_baseline(against),
        "in_sample": _in_sample(asked, plans=plans, cuts=cuts),
    }


def mean_pct(values: list[float]) -> float:
    return round(100 * sum(values) / len(values), 1) if values else 0.0
