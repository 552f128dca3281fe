"""What one memory search costs over one user's 1,000 messages: CPU of the web process, SQL
statements, wall time; a new query (embedded) and a repeated one (the per-process query cache).

    nice python bench/bench_search_cost.py [--messages 1000] [--queries 100]

A fresh throw-away database (like the tests); the user's turns are the LoCoMo-style dev set's
(tests/data/dev/conversations_dev.locomo.json, its dates and speakers), appended and embedded
through the REST API in-process (DRF's test client, API-key authentication, the real embedder),
then every question of the file is asked through POST /api/v1/memory/search, scope the user, all
kinds (as a caller who does not narrow them). CPU is this process's (every thread: the query
embedding runs on its own), measured with time.process_time around each request; statements
are counted on the connection. Medians are printed. Run it from the root of the checkout to
measure (it imports the code it finds there, so another checkout's is measured the same way).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.getcwd())
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_retrieval_quality import setup_django

DATA = Path(os.getcwd()) / "tests" / "data" / "dev" / "conversations_dev.locomo.json"


def turns_of(path: Path, limit: int) -> list[tuple[int, dict[str, Any]]]:
    """(session number, message body) of the file's turns, conversations one after another."""
    out: list[tuple[int, dict[str, Any]]] = []
    session_number = 0
    for sample in json.loads(path.read_text()):
        conversation = sample["conversation"]
        n = 1
        while f"session_{n}" in conversation:
            session_number += 1
            when = datetime_of(conversation[f"session_{n}_date_time"])
            for turn in conversation[f"session_{n}"]:
                body = {"role": "user", "name": turn["speaker"], "content": turn["text"], "occurred_at": when}
                out.append((session_number, body))
            n += 1
    return out[:limit]


def datetime_of(text: str) -> str:
    from datetime import UTC, datetime

    return (
        datetime.strptime(text.strip().title().replace(" On ", " on "), "%I:%M %p on %d %B, %Y")
        .replace(tzinfo=UTC)
        .isoformat()
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="cProfile the repeated queries (own time)")
    args = parser.parse_args()
    setup_django()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from memory.models import Tenant
    from memory.services import embedding, message_indexing
    from memory.services.tenancy import api_key_create

    tenant = Tenant.objects.create(name="bench", slug="bench-search-cost")
    _, secret = api_key_create(tenant=tenant, name="bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    def post(path: str, body: dict[str, Any]) -> Any:
        response = client.post(f"/api/v1{path}", body, format="json")
        assert response.status_code in (200, 201), (path, response.status_code, response.content[:300])
        return response.json()

    sessions: dict[int, str] = {}
    pending: dict[int, list[dict[str, Any]]] = {}
    for number, body in turns_of(DATA, args.messages):
        pending.setdefault(number, []).append(body)
    for number, bodies in pending.items():
        sessions[number] = post("/sessions", {"agent": "bot", "user_id": "u1"})["id"]
        post(f"/sessions/{sessions[number]}/messages", {"messages": bodies})
    started = time.perf_counter()
    while message_indexing.memory_index_drain().completed:
        pass
    print(f"{args.messages} messages in {len(sessions)} sessions of one user; embedded in "
          f"{time.perf_counter() - started:.1f} s; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    questions = [qa["question"] for sample in json.loads(DATA.read_text()) for qa in sample["qa"]]
    questions = questions[: args.queries]
    body = {"scope": {"user_id": "u1"}, "limit": 10}
    for question in questions[:5]:  # warm: model loaded, connection open, code paths taken
        post("/memory/search", {**body, "query": question + " (warm)"})

    embedder = embedding.embedder_get()
    calls = [0]
    real_embed = embedder.embed

    def counted(texts: list[str]) -> Any:
        calls[0] += 1
        return real_embed(texts)

    embedder.embed = counted  # type: ignore[method-assign]

    def measure(label: str, *, clear_cache: bool) -> None:
        cpu, wall, statements, model_calls = [], [], [], 0
        for question in questions:
            if clear_cache:
                embedding._query_cache.clear()
            else:
                post("/memory/search", {**body, "query": question})  # asked once before: cached
            before = calls[0]
            with CaptureQueriesContext(connection) as queries:
                c0, w0 = time.process_time(), time.perf_counter()
                post("/memory/search", {**body, "query": question})
                cpu.append((time.process_time() - c0) * 1000)
                wall.append((time.perf_counter() - w0) * 1000)
            statements.append(len(queries.captured_queries))
            model_calls += calls[0] - before
        print(
            f"{label:38} CPU median {median(cpu):5.1f} ms (p90 {sorted(cpu)[int(0.9 * len(cpu))]:5.1f})"
            f"  wall median {median(wall):5.1f} ms  statements median {median(statements):.0f} "
            f"(max {max(statements)}); model calls {model_calls / len(questions):.2f} per search",
            flush=True,
        )

    measure("search, a new query (embedded)", clear_cache=True)
    measure("search, a repeated query (cache)", clear_cache=False)
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        measure("search, repeated, under cProfile", clear_cache=False)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
    # The floor of any request: an authenticated GET of the tenant (authentication, throttle, DRF).
    cpu = []
    for _ in questions:
        c0 = time.process_time()
        response = client.get("/api/v1/tenant")
        cpu.append((time.process_time() - c0) * 1000)
        assert response.status_code == 200, response.content[:200]
    print(f"{'GET /api/v1/tenant (any request, the floor)':38} CPU median {median(cpu):5.1f} ms")
    # The floor of the query embedding itself: one MiniLM int8 call on this thread.
    embedder.embed = real_embed  # type: ignore[method-assign]
    cpu = []
    for question in questions:
        c0 = time.process_time()
        embedder.embed([question])
        cpu.append((time.process_time() - c0) * 1000)
    print(f"{'query embedding alone (the floor)':38} CPU median {median(cpu):5.1f} ms")


if __name__ == "__main__":
    main()
