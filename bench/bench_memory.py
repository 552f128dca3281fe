"""Memory search latency and context build with recall, at 100 and at N messages in a tenant.

    python bench/bench_memory.py --messages 100000 --queries 40

Synthetic tenant: N messages in sessions of 100 messages, 10 sessions per user, all of one agent.
Texts are the 998 turns of conversations_dev.locomo.json (with a row number), vectors mixtures
of their real MiniLM vectors (a + b/2 + noise, re-normalised), inserted with COPY; the tsvector is
PostgreSQL's own. Latencies are in-process service calls, the query embedding included (the
per-process query cache is cleared before every call):

- memory_search, scope = one user (1,000 messages in 10 sessions), and scope = the whole tenant
  (timed after a warm-up pass of 200 whole-tenant searches of other texts, printed too: the
  database's buffers as a running server has them, not as just after the tenant was built);
- context_build with recall on, for a session of that user, vs the same in a tenant holding only
  100 messages (one session);
- turn recall of the dev questions over the whole tenant (a guard for changes to the large-scope
  path: compare runs; see `tenant_recall`).

`--http` also times POST /api/v1/memory/search through a real uvicorn (one process, on the same
database) from a keep-alive client, for both scopes. Every timed question is asked once, so the
server's query-embedding cache never answers it: the embedding is included there too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_retrieval_quality import setup_django

ROOT = Path(__file__).resolve().parent.parent
# The repository sits beside shared/ (CI); a worktree under /work/wt/<name> has it two levels up.
DATA = (
    next(
        (p for p in (ROOT.parent / "shared" / "data", ROOT.parent.parent / "shared" / "data") if p.is_dir()),
        ROOT.parent / "shared" / "data",
    )
    / "conversations_dev.locomo.json"
)
COLUMNS = (
    "tenant_id, session_id, seq, role, content, token_count, turn_id, tool_call_id, tool_calls, event_kind, "
    "artifact_refs, metadata, created_at, name, occurred_at, search_config, embedding, embedding_status, "
    "embedding_model, embedding_attempts, embedding_error"
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def server_env() -> dict[str, str]:
    """The environment of a uvicorn (ctxapp.settings) on the bench database."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    host = db.get("OPTIONS", {}).get("host") or db.get("HOST") or ""
    user, password, port = db.get("USER") or "postgres", db.get("PASSWORD") or "", db.get("PORT")
    where = f"@/{db['NAME']}?host={host}" if host.startswith("/") else f"@{host}:{port}/{db['NAME']}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ctxapp.settings",
        "DATABASE_URL": f"postgresql://{user}:{password}{where}",
    }
    env.pop("CTXAPP_EMBEDDED_DATABASE_URL", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def http_search_times(
    base: str, secret: str, scopes: dict[str, dict], questions: list[str]
) -> dict[str, list[float]]:
    """Client-side ms per POST /api/v1/memory/search, per scope; each question asked once per scope."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    out: dict[str, list[float]] = {}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as client:
        for number, (name, scope) in enumerate(scopes.items()):
            # A distinct text per scope for the server's query cache (" ?" adds no search term).
            suffix = " ?" * number
            # Warm-up (scope cache, model, connection) with a question that is not timed.
            body = {"query": f"warm up {name}", "scope": scope, "kinds": ["message"]}
            client.post("/api/v1/memory/search", json=body).raise_for_status()
            times = []
            for q in questions:
                t0 = time.perf_counter()
                response = client.post("/api/v1/memory/search", json={**body, "query": f"{q}{suffix}"})
                times.append((time.perf_counter() - t0) * 1000)
                response.raise_for_status()
            out[name] = times
    return out


def backend_cpu_ms() -> float:
    """CPU time of this connection's PostgreSQL backend so far (/proc; NaN where unreadable)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def explain_search(fn: Callable[[str], object], question: str) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of every SELECT one search runs (after one untimed run)."""
    from django.db import connection

    from memory.services import embedding

    fn(question)
    statements: list[tuple[str, object]] = []

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        statements.append((sql, params))
        return execute(sql, params, many, context)

    embedding._query_cache.clear()
    with connection.execute_wrapper(wrapper):
        fn(question)
    with connection.cursor() as cursor:
        for sql, params in statements:
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            print("\n" + sql[:300] + "\n" + "\n".join(r[0] for r in cursor.fetchall()))


def profile_search(fn: Callable[[str], object], questions: list[str]) -> None:
    """Where one-user-scope search time goes: wall time per SQL statement shape, then cProfile."""
    import cProfile
    import pstats
    import re
    from collections import defaultdict

    from django.db import connection

    from memory.services import embedding

    sql_ms: dict[str, list[float]] = defaultdict(list)

    def wrapper(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            shape = re.sub(r"\s+", " ", sql)[:90]
            sql_ms[shape].append((time.perf_counter() - t0) * 1000)

    embed_ms = []
    for q in questions:
        embedding._query_cache.clear()
        t0 = time.perf_counter()
        embedding.embed_query(q)
        embed_ms.append((time.perf_counter() - t0) * 1000)
    print(
        f"query embedding alone: p50 {statistics.median(embed_ms):.1f} ms  p95 {pct(embed_ms, 0.95):.1f} ms"
    )
    with connection.execute_wrapper(wrapper):
        for q in questions:
            embedding._query_cache.clear()
            fn(q)
    print("SQL per statement shape (per search: calls, p50 ms of one call):")
    for shape, values in sorted(sql_ms.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {len(values) / len(questions):4.1f}x  {statistics.median(values):6.2f} ms  {shape}")
    profiler = cProfile.Profile()
    profiler.enable()
    for q in questions:
        embedding._query_cache.clear()
        fn(q)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def copy_messages(big, sessions, *, turns, base, model: str, per_session: int) -> int:  # type: ignore[no-untyped-def]
    """The big tenant's messages through COPY (texts and mixed real vectors), then its HNSW index."""
    import numpy as np
    from django.db import connection

    from memory.models import Message, Session

    rng = np.random.default_rng(7)
    table = Message._meta.db_table
    when = datetime(2025, 1, 1, tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute("DROP INDEX IF EXISTS message_embedding_hnsw")
        with cursor.cursor.copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as copy:
            n = 0
            for session in sessions:
                for seq in range(1, per_session + 1):
                    a, b = rng.integers(0, len(turns), 2)
                    vector = base[a] + 0.5 * base[b] + rng.normal(0.0, 0.02, size=384)
                    vector /= np.linalg.norm(vector)
                    speaker, text = turns[a]
                    copy.write_row(
                        (
                            big.pk, session.pk, seq, "user", f"{text} #{n}", 20, "", "", "[]", "", "[]", "{}",
                            when.isoformat(), speaker, (when + timedelta(minutes=n)).isoformat(), "english",
                            "[" + ",".join(f"{x:.5f}" for x in vector) + "]", "completed",
                            model, 1, "",
                        )
                    )  # fmt: skip
                    n += 1
        Session.objects.filter(pk__in=[s.pk for s in sessions]).update(
            message_seq=per_session, message_count=per_session
        )
        cursor.execute(
            "CREATE INDEX message_embedding_hnsw ON memory_message USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = 16, ef_construction = 64)"
        )
        cursor.execute("ANALYZE memory_message")
    return n


def tenant_recall(tenant, samples: list[dict]) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Turn recall (%) at 5 and 10 of the dev questions over the whole synthetic tenant: an evidence
    turn counts as found when a hit's content is its text (without the row number). Every turn is
    in the tenant ~100 times, so the top 10 hold few distinct turns: a guard for changes to the
    large-scope path (compare runs), not a figure to compare with `ctxapp eval recall`."""
    import re

    from memory.services.memory_search import memory_search

    at5, at10 = [], []
    for sample in samples:
        texts = {
            turn["dia_id"]: turn["text"]
            for key, value in sample["conversation"].items()
            if key.startswith("session_") and isinstance(value, list)
            for turn in value
        }
        for qa in sample["qa"]:
            evidence = {texts[dia_id] for dia_id in qa.get("evidence", []) if dia_id in texts}
            if not evidence:
                continue
            hits = memory_search(tenant=tenant, query=qa["question"], kinds=["message"], limit=10).results
            found = [re.sub(r" #\d+$", "", hit.text) for hit in hits]
            at5.append(len(evidence & set(found[:5])) / len(evidence))
            at10.append(len(evidence & set(found)) / len(evidence))
    return 100 * statistics.mean(at5), 100 * statistics.mean(at10)


def small_tenant(turns: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    """The tenant of 100 messages in one session (the kept one, if there is one)."""
    from memory.models import Message, Session, Tenant
    from memory.services import message_indexing
    from memory.services.sessions import MessageInput, messages_append, session_create

    small = Tenant.objects.filter(slug="small").first()
    if small is None:
        small = Tenant.objects.create(name="small", slug="small")
        session_create(tenant=small, agent_external_id="bot", user_id="u0")
    small_session = Session.objects.filter(tenant=small).get()
    if not Message.objects.filter(tenant=small).exists():
        messages_append(
            tenant=small,
            session=small_session,
            items=[MessageInput(role="user", name=s, content=t) for s, t in turns[:100]],
        )
        message_indexing.memory_index_drain()
    return small, small_session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also break one-user-scope search time down: SQL per statement, cProfile",
    )
    parser.add_argument(
        "--profile-tenant",
        action="store_true",
        help="the same for the whole-tenant scope, and EXPLAIN ANALYZE of its SELECTs",
    )
    parser.add_argument(
        "--keep-database",
        action="store_true",
        help="keep the bench database and reuse its tenants when they are there (needs "
        "CTXAPP_TEST_DATABASE_URL: a server that outlives the run); build them otherwise",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="also time POST /api/v1/memory/search through a real uvicorn (both scopes)",
    )
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    setup_django(keep=args.keep_database)

    from memory.models import Message, Session, Tenant
    from memory.services import embedding
    from memory.services.context import context_build
    from memory.services.memory_search import SearchScope, memory_search
    from memory.services.sessions import session_create

    samples = json.loads(Path(args.data).read_text())
    turns = [
        (t["speaker"], t["text"])
        for s in samples
        for key, value in s["conversation"].items()
        if key.startswith("session_") and isinstance(value, list)
        for t in value
    ]
    questions = [q["question"] for s in samples for q in s["qa"]][: args.queries]
    embedder = embedding.embedder_get()
    base = embedder.embed([f"{speaker}: {text}" for speaker, text in turns])

    def timed(fn: Callable[[str], object]) -> list[float]:
        out = []
        for q in questions:
            embedding._query_cache.clear()
            t0 = time.perf_counter()
            fn(q)
            out.append((time.perf_counter() - t0) * 1000)
        return out

    # --- small tenant: 100 messages in one session ------------------------------------------------
    small, small_session = small_tenant(turns)
    for q in questions[:3]:  # warm-up: model, caches
        context_build(tenant=small, session=small_session, next_input=q)
    small_build = timed(lambda q: context_build(tenant=small, session=small_session, next_input=q))

    # --- big tenant ---------------------------------------------------------------------------------
    big = Tenant.objects.filter(slug="big").first()
    if big is not None and Message.objects.filter(tenant=big).count() == args.messages:
        build_big = None
    else:
        if big is not None:
            raise SystemExit(
                "the kept database holds another size of tenant: drop it (without --keep-database)"
            )
        big = Tenant.objects.create(name="big", slug="big")
        build_big = big
    per_session, per_user = 100, 10
    sessions = list(Session.objects.filter(tenant=big).order_by("pk"))
    for i in range(max(1, args.messages // per_session) if build_big else 0):
        sessions.append(session_create(tenant=big, agent_external_id="bot", user_id=f"u{i // per_user}"))
    if build_big is not None:
        started = time.perf_counter()
        n = copy_messages(
            big, sessions, turns=turns, base=base, model=embedder.model_name, per_session=per_session
        )
        print(f"inserted {n} messages + HNSW in {time.perf_counter() - started:.0f} s", flush=True)
    else:
        n = Message.objects.filter(tenant=big).count()
        print(f"reusing the kept tenant of {n} messages", flush=True)
    target = sessions[-1]
    target.refresh_from_db()
    user_scope = SearchScope(user_id=target.user_id)
    memory_search(tenant=big, query=questions[0], scope=user_scope)  # warm: model, connection
    user_search = timed(lambda q: memory_search(tenant=big, query=q, scope=user_scope, kinds=["message"]))
    if args.profile:
        profile_search(
            lambda q: memory_search(tenant=big, query=q, scope=user_scope, kinds=["message"]), questions
        )
    if args.profile_tenant:
        whole = lambda q: memory_search(tenant=big, query=q, kinds=["message"])  # noqa: E731
        explain_search(whole, questions[1])
        profile_search(whole, questions)
    # A running server's buffers hold what its searches walk (shared_buffers: ctxapp/infra/embedded.py);
    # a bench that has just built the tenant, or restarted its kept server, starts from cold ones.
    # Warm them with other texts (every 5th turn: not the timed questions), and print that pass.
    warm_texts = [text for _, text in turns[::5]][: len(questions)]
    warm_up: list[float] = []
    for text in warm_texts:
        embedding._query_cache.clear()
        t0 = time.perf_counter()
        memory_search(tenant=big, query=text, kinds=["message"])
        warm_up.append((time.perf_counter() - t0) * 1000)
    cpu_started = (time.process_time(), backend_cpu_ms())
    tenant_search = timed(lambda q: memory_search(tenant=big, query=q, kinds=["message"]))
    tenant_cpu = ((time.process_time() - cpu_started[0]) * 1000, backend_cpu_ms() - cpu_started[1])
    for q in questions[:3]:
        context_build(tenant=big, session=target, next_input=q)
    big_build = timed(lambda q: context_build(tenant=big, session=target, next_input=q))

    def row(name: str, values: list[float]) -> str:
        return f"{name:<58} p50 {statistics.median(values):7.1f} ms   p95 {pct(values, 0.95):7.1f} ms"

    print(f"\n{n} messages in the big tenant; {len(questions)} queries each; query embedding included")
    print(row("memory_search, scope one user (1,000 messages)", user_search))
    print(row(f"warm-up: whole tenant, {len(warm_texts)} turn texts as queries", warm_up))
    print(row(f"memory_search, scope whole tenant ({n} messages)", tenant_search))
    print(
        f"  CPU per whole-tenant search: this process {tenant_cpu[0] / len(questions):.1f} ms (query "
        f"embedding included), its PostgreSQL backend {tenant_cpu[1] / len(questions):.1f} ms"
    )
    recall_5, recall_10 = tenant_recall(big, samples)
    print(f"  turn recall over the whole tenant (each turn ~100x): R@5 {recall_5:.1f}, R@10 {recall_10:.1f}")
    print(row("context_build + recall, tenant of 100 messages", small_build))
    print(row(f"context_build + recall, user of the {n}-message tenant", big_build))
    print(f"ratio of build p50s: {statistics.median(big_build) / statistics.median(small_build):.2f}")
    if args.http:
        from memory.services.tenancy import api_key_create

        secret = api_key_create(tenant=big, name="bench")[1]
        sys.path.insert(0, str(ROOT))
        from tests.dashboard.live_server import uvicorn_server

        with uvicorn_server(server_env(), timeout=90) as base:
            http = http_search_times(
                base, secret, {"one user": {"user_id": target.user_id}, "whole tenant": {}}, questions
            )
        print(row("HTTP POST /memory/search, scope one user (1,000 messages)", http["one user"]))
        print(row(f"HTTP POST /memory/search, whole tenant ({n} messages)", http["whole tenant"]))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
