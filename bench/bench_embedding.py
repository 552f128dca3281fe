"""Embedding throughput of the local MiniLM int8 model, drain time of N pending experiences
through the real embedding job body (batches of CTXAPP_EMBEDDING_BATCH_SIZE), and process memory.

    python bench/bench_embedding.py --pending 10000

The drain runs the job body in this process, exactly as a solo-pool worker does, so the peak RSS
printed is the worker's memory with the model loaded.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_retrieval_quality import DEFAULT_DATA, setup_django


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=10_000)
    args = parser.parse_args()
    setup_django()
    from django.conf import settings
    from django.db import transaction

    from memory.models import Experience, Tenant
    from memory.services.embedding import embedder_get
    from memory.services.experiences import experience_create, experiences_embed

    rows = [json.loads(line) for line in Path(DEFAULT_DATA).read_text().splitlines() if line.strip()]
    texts = [f"Problem: {r['problem']}\nSolution: {r['solution']}" for r in rows]
    before = rss_mb()
    started = time.perf_counter()
    embedder = embedder_get()  # the one instance the job body uses too
    embedder.embed(["warm up"])
    print(f"model load + first text: {time.perf_counter() - started:.2f}s, RSS +{rss_mb() - before:.0f} MB")
    for batch in (1, 16, 64):
        sample = (texts * 10)[:480]
        started = time.perf_counter()
        for i in range(0, len(sample), batch):
            embedder.embed(sample[i : i + batch])
        seconds = time.perf_counter() - started
        print(f"throughput, batch {batch:>2}: {len(sample) / seconds:6.0f} texts/s")

    tenant = Tenant.objects.create(name="bench", slug="bench")
    from memory.models import ExperiencePolicy

    # Copies of 60 dev rows are near-duplicates of each other; measure the embedding drain, not
    # merges (the neighbour check still runs for every row).
    ExperiencePolicy.objects.update_or_create(
        tenant=tenant, defaults={"merge_threshold": 1.01, "supersede_problem_threshold": 1.01}
    )
    with transaction.atomic():  # distinct texts (a counter) so the cache does not short-cut
        for i in range(args.pending):
            r = rows[i % len(rows)]
            experience_create(tenant=tenant, problem=f"{r['problem']} (case {i})", solution=r["solution"])
    ids = list(Experience.objects.filter(tenant=tenant).order_by("pk").values_list("pk", flat=True))
    print(f"RSS before the drain (model loaded, {len(ids):,} rows created): {rss_mb():.0f} MB")
    size = settings.CTXAPP.embedding_batch_size
    started = time.perf_counter()
    done = 0
    for i in range(0, len(ids), size):
        done += experiences_embed(experience_ids=ids[i : i + size])
    seconds = time.perf_counter() - started
    hidden = Experience.objects.filter(tenant=tenant).exclude(merged_into=None).count()
    print(
        f"drained {done:,} pending experiences in {seconds:.1f}s ({done / seconds:.0f}/s, batches of {size}; "
        f"{hidden:,} merged as near-duplicates on the way)"
    )
    print(f"RSS after the drain: {rss_mb():.0f} MB")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this worker-equivalent process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
