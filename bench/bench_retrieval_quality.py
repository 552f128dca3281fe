"""Retrieval quality on the paraphrase dev set: R@1, R@5, MRR for vector only, full text only and
hybrid (weighted fusion at several lexical weights, and reciprocal rank fusion).

    python bench/bench_retrieval_quality.py [--data ../shared/data/retrieval_dev.jsonl]

Starts a throw-away PostgreSQL + pgvector (the test settings), stores the 60 experiences through
the real service (pending → embedded by the real job body with the local MiniLM model) and runs
the real search function for 120 paraphrase and 60 keyword queries.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "retrieval_dev.jsonl"


def setup_django(*, keep: bool = False) -> None:
    """Django on a fresh throw-away database with tables from the models (like the tests); with
    `keep`, the database of an earlier run is kept and reused (created if missing)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import django
    from django.conf import settings

    django.setup()
    from django.db import connection

    connection.settings_dict["TEST"].update({"NAME": "bench_ctxapp", "MIGRATE": False})
    settings.DATABASES["default"]["TEST"].update({"NAME": "bench_ctxapp", "MIGRATE": False})
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=keep)


def metrics(ranks: list[int | None]) -> dict[str, float]:
    n = len(ranks)
    return {
        "R@1": sum(1 for r in ranks if r == 1) / n,
        "R@5": sum(1 for r in ranks if r is not None and r <= 5) / n,
        "MRR": sum(1.0 / r for r in ranks if r is not None) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    args = parser.parse_args()
    setup_django()
    from memory.models import Experience, Tenant
    from memory.services.experience_search import experiences_search
    from memory.services.experiences import experience_create, experiences_embed

    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    tenant = Tenant.objects.create(name="bench", slug="bench")
    by_public: dict[str, str] = {}
    for row in rows:
        result = experience_create(tenant=tenant, problem=row["problem"], solution=row["solution"])
        by_public[result.experience.public_id] = row["id"]
    started = time.perf_counter()
    experiences_embed(
        experience_ids=list(Experience.objects.filter(tenant=tenant).values_list("pk", flat=True))
    )
    embed_seconds = time.perf_counter() - started
    hidden = Experience.objects.filter(tenant=tenant).exclude(merged_into=None, superseded_by=None).count()
    print(f"stored {len(rows)} experiences, embedded in {embed_seconds:.2f}s; merged/superseded: {hidden}")

    paraphrases = [(q, row["id"]) for row in rows for q in row["paraphrase_queries"]]
    keywords = [(row["keyword_query"], row["id"]) for row in rows]
    plans = {
        "vector only": {"sources": ["vector"]},
        "full text only": {"sources": ["text"]},
        "min-max 1.0 / 0.1": {"fusion": "minmax", "weights": {"vector": 1.0, "text": 0.1}},
        "z-score 1.0 / 0.05": {"weights": {"vector": 1.0, "text": 0.05}},
        "z-score 1.0 / 0.1 (default)": {"weights": {"vector": 1.0, "text": 0.1}},
        "z-score 1.0 / 0.2": {"weights": {"vector": 1.0, "text": 0.2}},
        "z-score 1.0 / 0.3": {"weights": {"vector": 1.0, "text": 0.3}},
        "z-score 1.0 / 0.5": {"weights": {"vector": 1.0, "text": 0.5}},
        "z-score 1.0 / 1.0": {"weights": {"vector": 1.0, "text": 1.0}},
    }
    header = f"{'paraphrase R@1':>14} {'R@5':>6} {'MRR':>6} | {'keyword R@1':>11} {'R@5':>6} {'MRR':>6}"
    print(f"{'plan':30} | {header}")
    for name, plan in plans.items():
        line = f"{name:30} |"
        for queries in (paraphrases, keywords):
            ranks: list[int | None] = []
            for query, expected in queries:
                hits = experiences_search(tenant=tenant, query=query, limit=10, **plan).hits
                found = [by_public[h.experience.public_id] for h in hits]
                ranks.append(found.index(expected) + 1 if expected in found else None)
            m = metrics(ranks)
            width = 14 if queries is paraphrases else 11
            line += f" {m['R@1']:>{width}.3f} {m['R@5']:>6.3f} {m['MRR']:>6.3f} |"
        print(line)


if __name__ == "__main__":
    main()
