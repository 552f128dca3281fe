"""Figures for docs/production.md "Sizing": embedding CPU cost, PostgreSQL bytes per message.

    python bench/bench_sizing.py                 # ~3 min: 20,000 messages
    python bench/bench_sizing.py --messages 5000 # quicker

1. Texts embedded per CPU-second by the local model (MiniLM int8, one intra-op thread, batches of
   64, as the embedding drain calls it), measured with `time.process_time()`, so the figure does not
   depend on what else the machine runs; and texts per wall second with every core.
2. PostgreSQL bytes per message: messages appended through `messages_append` (batches of 500, the
   998 LoCoMo dev turns in turn), each given a 384-dimension unit vector (random: the HNSW index's
   size does not depend on the values) as the embedding drain would, then VACUUM ANALYZE and the
   sizes of `memory_message` (heap, TOAST, each index) and of the event log it wrote.
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_ingest import prepare  # noqa: E402

DATA = Path(os.environ.get("CTXAPP_SHARED_DATA", "/work/shared/data")) / "conversations_dev.locomo.json"
FALLBACK = ROOT / "tests" / "data" / "dev" / "conversations_dev.locomo.json"


def turns() -> list[str]:
    path = DATA if DATA.exists() else FALLBACK
    samples = json.loads(path.read_text())
    return [
        turn["text"]
        for sample in samples
        for key, value in sample["conversation"].items()
        if key.startswith("session_") and isinstance(value, list)
        for turn in value
    ]


def embedding_cost(texts: list[str]) -> None:
    from memory.services.embedding import MiniLMEmbedder  # lazy: django-setup

    sample = (texts * 2)[:1024]
    one = MiniLMEmbedder(threads=1, parallel=1)
    one.embed(sample[:64])  # load the model
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(0, len(sample), 64):
        one.embed(sample[i : i + 64])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(
        f"local model, 1 thread, batches of 64: {len(sample) / cpu:,.0f} texts per CPU-second ({len(sample) / wall:,.0f} per wall second)"
    )
    every = MiniLMEmbedder()
    every.embed(sample[:64])
    wall = time.perf_counter()
    every.embed(sample)
    print(
        f"local model, default (sub-batches on {os.cpu_count()} cores): {len(sample) / (time.perf_counter() - wall):,.0f} texts per wall second"
    )


def storage(texts: list[str], n: int) -> None:
    import numpy as np  # lazy: startup-cost
    from django.db import connection  # lazy: django-setup

    from memory.models import ApiKey  # lazy: django-setup
    from memory.services import sessions as svc  # lazy: django-setup

    tenant = ApiKey.objects.select_related("tenant").get().tenant
    rng = np.random.default_rng(7)
    started = time.perf_counter()
    written = 0
    session = svc.session_create(tenant=tenant, agent_external_id="sizing", user_id="u0")
    while written < n:
        if written and written % 1000 == 0:  # sessions of 1,000 messages, as bench_scale's tenant
            session = svc.session_create(
                tenant=tenant, agent_external_id="sizing", user_id=f"u{written // 1000}"
            )
        batch = [
            svc.MessageInput(
                role="user" if (written + i) % 2 == 0 else "assistant",
                content=texts[(written + i) % len(texts)],
            )
            for i in range(min(500, n - written))
        ]
        messages = svc.messages_append(tenant=tenant, session=session, items=batch)
        vectors = rng.standard_normal((len(messages), 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE memory_message AS m SET embedding = v.e::vector, embedding_status = 'completed' "
                "FROM unnest(%s::bigint[], %s::text[]) AS v(id, e) WHERE m.id = v.id",
                [
                    [m.pk for m in messages],
                    ["[" + ",".join(f"{x:.6f}" for x in row) + "]" for row in vectors],
                ],
            )
        written += len(messages)
    print(f"{written:,} messages appended and embedded in {time.perf_counter() - started:.0f} s")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE memory_message")
        cursor.execute("VACUUM ANALYZE memory_event")
        cursor.execute(
            "SELECT pg_relation_size('memory_message'), "
            "pg_total_relation_size('memory_message') - pg_relation_size('memory_message') - pg_indexes_size('memory_message'), "
            "pg_indexes_size('memory_message'), pg_total_relation_size('memory_event')"
        )
        heap, toast, indexes, events = cursor.fetchone()
        cursor.execute(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            "WHERE indrelid = 'memory_message'::regclass ORDER BY 2 DESC"
        )
        each = cursor.fetchall()
    per = 1 / written
    print(
        f"memory_message heap {heap * per:,.0f} B/message, TOAST {toast * per:,.0f}, indexes {indexes * per:,.0f}, events {events * per:,.0f}"
    )
    for name, size in each:
        print(f"  index {name}: {size * per:,.0f} B/message")
    total = (heap + toast + indexes + events) * per
    print(
        f"total {total:,.0f} B/message = {total * 1e6 / 2**30:.2f} GiB per million messages (linear extrapolation)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-sizing-"))
    atexit.register(shutil.rmtree, data_dir, True)
    os.environ["CTXAPP_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("CTXAPP_SECRET_KEY", "bench-secret-key")
    os.environ.setdefault("CTXAPP_LOG_LEVEL", "warning")
    prepare(data_dir)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}"
    )
    texts = turns()
    embedding_cost(texts)
    storage(texts, args.messages)
    print(f"load after the run: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
