"""Mixed-kind ordering and the relevance floor, offline, on both shared dev sets.

    python bench/bench_ordering.py

Each LoCoMo conversation is searched together with the 60 experiences of retrieval_dev.jsonl
(problem/solution texts about software operations: unrelated to every conversation question),
as a default `POST /memory/search` (all kinds) sees a user's turns and the tenant's
experiences. For each way of putting the two kinds in one list it prints turn R@5/R@10 (the
experiences count as misses), the mean number of experiences in a question's top 5 (all of them
unrelated), and, the other way round, experience R@5 of retrieval_dev's paraphrase queries
searched over the experiences plus one conversation's turns.

- "merge by rank": each kind ranked in its own pool (DEFAULT_PLAN / EXPERIENCE_PLAN), the two
  lists interleaved by rank (what memory search did before one score scale).
- "one pool": every candidate ranked together under one plan: one score scale.
- "+ floor t": then an item is left out unless it shares a query term or its cosine to the
  query is at least t (`relevance_floor.passes_floor`).

Uses the embedding cache of bench/bench_recall_offline.py (/tmp/ctxapp_rank_cache).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path

import django
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_recall_offline as offline  # noqa: E402

from memory.services import ranking, relevance_floor  # noqa: E402
from memory.services.ranking import Plan  # noqa: E402

FLOORS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
Merge = Callable[[offline.Pool, Plan], list[ranking.Ranked]]


def merge_by_rank(found: offline.Pool, plan: Plan) -> list[ranking.Ranked]:
    conversational = [c for c in found.candidates if c.kind != "experience"]
    distilled = [c for c in found.candidates if c.kind == "experience"]
    lists = [
        ranking.rank(query=found.query, candidates=conversational, plan=plan),
        ranking.rank(query=found.query, candidates=distilled, plan=ranking.EXPERIENCE_PLAN),
    ]
    return [item for group in zip_longest(*lists) for item in group if item is not None]


def one_pool(found: offline.Pool, plan: Plan) -> list[ranking.Ranked]:
    return ranking.rank(query=found.query, candidates=found.candidates, plan=plan)


def floored(merge: Merge, floor: float) -> Merge:
    def run(found: offline.Pool, plan: Plan) -> list[ranking.Ranked]:
        return [
            r
            for r in merge(found, plan)
            if relevance_floor.passes_floor(query=found.query, candidate=r.candidate, min_similarity=floor)
        ]

    return run


def mixed_scope(turns: offline.Scope, experiences: offline.Scope) -> offline.Scope:
    scope = offline.Scope(turns.docs + experiences.docs, np.vstack([turns.vectors, experiences.vectors]))
    scope.prepare()
    return scope


def turn_recall(scopes: list[offline.Scope], questions: list[offline.Question], merge: Merge) -> str:
    plan = ranking.DEFAULT_PLAN
    r5, r10, intruders, listed = [], [], [], []
    for q in questions:
        assert q.vector is not None
        ranked = merge(offline.gather(scopes[q.scope], q.text, q.vector, plan), plan)
        keys = [r.candidate.key for r in ranked]
        r5.append(offline.recall_at(keys, q.expected, 5))
        r10.append(offline.recall_at(keys, q.expected, 10))
        intruders.append(sum(1 for r in ranked[:5] if r.candidate.kind == "experience"))
        listed.append(sum(1 for r in ranked[:10] if r.candidate.kind == "experience"))
    return (
        f"turn R@5 {100 * np.mean(r5):5.1f}  R@10 {100 * np.mean(r10):5.1f}  "
        f"experiences in top 5: {np.mean(intruders):.2f} (questions with any: "
        f"{100 * np.mean([i > 0 for i in intruders]):.0f} %), in the top 10: {np.mean(listed):.2f}"
    )


def experience_recall(scope: offline.Scope, questions: list[offline.Question], merge: Merge) -> str:
    plan = ranking.DEFAULT_PLAN
    r5 = []
    for q in questions:
        assert q.vector is not None
        keys = [r.candidate.key for r in merge(offline.gather(scope, q.text, q.vector, plan), plan)]
        r5.append(offline.recall_at(keys, q.expected, 5))
    return f"paraphrase R@5 {100 * np.mean(r5):5.1f}"


def recall_by_question(
    scopes: list[offline.Scope], questions: list[offline.Question], floor: float
) -> list[tuple[float, float]]:
    plan, out = ranking.DEFAULT_PLAN, []
    for q in questions:
        assert q.vector is not None
        ranked = floored(one_pool, floor)(offline.gather(scopes[q.scope], q.text, q.vector, plan), plan)
        keys = [r.candidate.key for r in ranked]
        out.append((offline.recall_at(keys, q.expected, 5), offline.recall_at(keys, q.expected, 10)))
    return out


def cross_validate_floor(scopes: list[offline.Scope], questions: list[offline.Question]) -> str:
    """Leave one conversation out: on the others, the highest floor whose R@5 and R@10 are those
    without a floor; its recall on the held-out conversation."""
    table = {t: recall_by_question(scopes, questions, t) for t in FLOORS}
    picked: list[float] = []
    held: list[tuple[float, float]] = []
    for held_out in sorted({q.scope for q in questions}):
        train = [i for i, q in enumerate(questions) if q.scope != held_out]
        test = [i for i, q in enumerate(questions) if q.scope == held_out]

        def mean(t: float, rows: list[int], k: int) -> float:
            return float(np.mean([table[t][i][k] for i in rows]))

        best = max(t for t in FLOORS if all(mean(t, train, k) >= mean(0.0, train, k) - 1e-9 for k in (0, 1)))
        picked.append(best)
        held.extend(table[best][i] for i in test)
    r5, r10 = (100 * float(np.mean([row[k] for row in held])) for k in (0, 1))
    return f"floors picked {picked}; held-out turn R@5 {r5:.1f}  R@10 {r10:.1f}"


def main() -> None:
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    django.setup()
    embedder = offline.make_embedder("minilm")
    scopes, questions = offline.load_locomo(embedder, offline.DATA / "conversations_dev.locomo.json")
    experiences, paraphrases, _ = offline.load_experiences(embedder, offline.DATA / "retrieval_dev.jsonl")
    experiences.extra_vectors = None  # memory search: the cosine to the experience's own text
    mixed = [mixed_scope(s, experiences) for s in scopes]
    methods: list[tuple[str, Merge]] = [("merge by rank", merge_by_rank), ("one pool", one_pool)]
    methods += [(f"one pool + floor {t}", floored(one_pool, t)) for t in FLOORS if t > 0]
    print("turns only, default plan (no experiences):", turn_recall(scopes, questions, one_pool))
    for t in FLOORS[1:]:
        print(f"turns only + floor {t}:", turn_recall(scopes, questions, floored(one_pool, t)))
    print("cross-validated floor (turns + experiences):", cross_validate_floor(mixed, questions))
    for name, merge in methods:
        print(
            f"{name:24} {turn_recall(mixed, questions, merge)}  |  "
            f"{experience_recall(mixed[0], paraphrases, merge)}"
        )


if __name__ == "__main__":
    main()
