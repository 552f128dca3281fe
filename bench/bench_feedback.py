"""What outcome feedback on experiences does to their ranking in a context, on retrieval_dev.jsonl.

    python bench/bench_feedback.py [--weights 0,0.05,0.1,0.2,0.4] [--accuracy 1.0,0.8,0.6]

A context's `memory` slots rank experiences with `experience_search.memory_rank`: 0.5·similarity
+ 0.3·confidence + 0.2·scope priority + helpful_weight · (helpful - unhelpful) / (votes + 1)
(ExperiencePolicy.helpful_weight, default 0.1). This replays agents that use the slot's best
experience and report its outcome:

- the 60 experiences of retrieval_dev.jsonl, each with two paraphrase queries: the first
  paraphrases are the *feedback* pass, the second ones the *held-out* pass;
- feedback pass: for each query, the experience ranked first is reported helpful when it is the
  one the query is about and unhelpful otherwise, by an agent right with probability `accuracy`
  (a wrong report says the opposite), seeded;
- held-out pass: R@1 and R@3 of the slot ranking with the votes gathered, for each helpful_weight
  (0 = feedback ignored), beside the same without any votes.

Similarity is what experiences search computes (0.6·cos(text) + 0.4·cos("Problem: …"), the real
MiniLM embedder, cached like bench_recall_offline.py); confidence 0.5 and the tenant scope for all,
so feedback is the only thing that differs. Pure: memory_rank on unsaved rows, no database.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

import django
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_recall_offline import CachedEmbedder, make_embedder  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(ROOT / "tests" / "data" / "dev" / "retrieval_dev.jsonl"))
    parser.add_argument("--weights", default="0,0.05,0.1,0.2,0.4")
    parser.add_argument("--accuracy", default="1.0,0.8,0.6")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    django.setup()
    import json

    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    embedder = make_embedder("minilm")
    similarity = _similarities(embedder, rows)
    weights = [float(w) for w in args.weights.split(",")]
    print(f"{len(rows)} experiences; feedback pass: paraphrase 1, held-out: paraphrase 2")
    print("accuracy  helpful_weight  held-out R@1  R@3   (no votes: R@1 / R@3 at weight 0)")
    for accuracy in (float(a) for a in args.accuracy.split(",")):
        for weight in weights:
            r1s, r3s = [], []
            for seed in range(args.seeds):
                votes = _feedback_pass(similarity[0], accuracy=accuracy, weight=weight, seed=seed)
                r1, r3 = _held_out(similarity[1], votes=votes, weight=weight)
                r1s.append(r1)
                r3s.append(r3)
            print(
                f"{accuracy:8.1f}  {weight:14.2f}  {100 * np.mean(r1s):12.1f}  {100 * np.mean(r3s):4.1f}",
                flush=True,
            )


def _similarities(embedder: CachedEmbedder, rows: list[dict[str, object]]) -> list[np.ndarray]:
    """[pass] → (queries by experiences) similarity as experiences search computes it."""
    texts = [f"Problem: {str(r['problem']).strip()}\nSolution: {str(r['solution']).strip()}" for r in rows]
    problems = [f"Problem: {str(r['problem']).strip()}" for r in rows]
    text_vectors = embedder.embed(texts, query=False)
    problem_vectors = embedder.embed(problems, query=False)
    out = []
    for index in (0, 1):
        queries = embedder.embed([list(r["paraphrase_queries"])[index] for r in rows], query=True)  # type: ignore[call-overload]
        out.append(0.6 * (queries @ text_vectors.T) + 0.4 * (queries @ problem_vectors.T))
    return out


def _scores(similarity: np.ndarray, votes: np.ndarray, weight: float) -> np.ndarray:
    from memory.models import Experience, ExperiencePolicy
    from memory.models.experiences import ExperienceScope
    from memory.services.experience_search import memory_rank
    from memory.services.search_hit import SearchHit

    policy = ExperiencePolicy(helpful_weight=weight)
    out = np.zeros_like(similarity)
    for j, (helpful, unhelpful) in enumerate(votes):
        row = Experience(
            public_id=f"e{j}", confidence=0.5, scope=ExperienceScope.TENANT,
            helpful_count=int(helpful), unhelpful_count=int(unhelpful),
        )  # fmt: skip
        for i in range(similarity.shape[0]):
            hit = SearchHit(kind="experience", id=row.public_id, text="", score=0.0, contributions={},
                            similarity=float(similarity[i, j]), experience=row)  # fmt: skip
            out[i, j] = memory_rank(hit=hit, policy=policy).score
    return out


def _feedback_pass(similarity: np.ndarray, *, accuracy: float, weight: float, seed: int) -> np.ndarray:
    """Votes (helpful, unhelpful) per experience after each query's first slot is reported on;
    the ranking used for each query includes the votes gathered so far."""
    rng = random.Random(seed)
    votes = np.zeros((similarity.shape[1], 2), dtype=int)
    order = list(range(similarity.shape[0]))
    rng.shuffle(order)
    for i in order:
        first = int(np.argmax(_scores(similarity[i : i + 1], votes, weight)[0]))
        right = first == i
        helpful = right if rng.random() < accuracy else not right
        votes[first, 0 if helpful else 1] += 1
    return votes


def _held_out(similarity: np.ndarray, *, votes: np.ndarray, weight: float) -> tuple[float, float]:
    scores = _scores(similarity, votes, weight)
    ranks = [int((scores[i] > scores[i, i]).sum()) + 1 for i in range(similarity.shape[0])]
    return float(np.mean([r == 1 for r in ranks])), float(np.mean([r <= 3 for r in ranks]))


if __name__ == "__main__":
    main()
