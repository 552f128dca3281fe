"""Import throughput of the memory index: append the dev set's 998 turns in batches, drain the
embedding, in-process (no HTTP, no broker) — the part of `ctxapp eval recall`'s ingest_s that the
worker spends.

    python bench/bench_memory_ingest.py [--profile]

One session per LoCoMo session (speaker as `name`, the session date as `occurred_at`), one append
per session, then `memory_index_drain()` until nothing is pending, with a cold EmbeddingCache.
Prints appends, drain and total msgs/s, and the load average before and after; `--profile` adds
the drain's cProfile. Per-process one-offs are paid before the clock starts, as a running server
or worker has paid them: the model load and tiktoken's first encoding load (~1.5-3 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import DATA
from bench_retrieval_quality import setup_django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--profile", action="store_true", help="cProfile of the drain")
    parser.add_argument("--profile-appends", action="store_true", help="cProfile of the appends")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    setup_django()
    from ctxapp.cli.evaluation_data import load
    from memory.models import Tenant
    from memory.services import embedding, message_indexing
    from memory.services.sessions import MessageInput, messages_append, session_create
    from memory.services.tokens import count_tokens

    embedding.embedder_get().embed(["warm up"])  # model load is per process, not per import
    count_tokens("warm up")  # so is tiktoken's encoding
    tenant = Tenant.objects.create(name="ingest", slug="ingest")
    conversations = load(args.data)
    if args.profile_appends:
        import cProfile
        import pstats

        append_profiler = cProfile.Profile()
        append_profiler.enable()
    started = time.perf_counter()
    total = 0
    for number, conv in enumerate(conversations):
        for _, when, turns in conv.sessions:
            session = session_create(tenant=tenant, agent_external_id=f"c{number}", user_id=f"c{number}")
            items = [
                MessageInput(
                    role="user",
                    name=str(t.get("speaker") or ""),
                    content=str(t.get("text") or ""),
                    occurred_at=when,
                )
                for t in turns
            ]
            messages_append(tenant=tenant, session=session, items=items)
            total += len(items)
    appended = time.perf_counter()
    if args.profile_appends:
        append_profiler.disable()
        pstats.Stats(append_profiler).sort_stats("cumulative").print_stats(30)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
    cpu = time.process_time()
    result = message_indexing.memory_index_drain(time_budget=float("inf"))
    done = time.perf_counter()
    cpu = time.process_time() - cpu
    if args.profile:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    append_s, drain_s = appended - started, done - appended
    print(f"{total} messages; appends {append_s:.2f} s ({total / append_s:.0f} msgs/s)")
    print(f"drain {drain_s:.2f} s ({result.completed / drain_s:.0f} msgs/s, batches {result.batches})")
    print(f"drain CPU of this process {cpu:.2f} s ({result.completed / cpu:.0f} msgs per CPU second)")
    print(f"total {append_s + drain_s:.2f} s: {total / (append_s + drain_s):.0f} msgs/s")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
