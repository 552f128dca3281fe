"""A million messages in one tenant: build time, index sizes, search, recall, append, memory.

    python bench/bench_scale.py                       # 1,000,000 messages (10,000 sessions, 1,000 users)
    python bench/bench_scale.py --messages 100000     # the same shape, 10x smaller
    CTXAPP_TEST_DATABASE_URL=... python bench/bench_scale.py --keep-database [--build-only]

Shape: sessions of 100 messages, 10 sessions per user, one agent; a tenant of N messages has N/100
sessions of N/1,000 users.

Texts and vectors. Embedding a million texts with the local model would take ~2 hours of both
cores, so `--base-texts` (10,000) real texts are embedded once with the real embedder and reused:
each base text is two turns of one LoCoMo dev conversation ("A: ... B: ..."), and each message is
one base text (plus its row number) with that text's real vector plus Gaussian noise (sigma 0.02
per dimension, re-normalised: cosine ~0.93 to its base). The noise keeps the vectors distinct
(exact duplicates make HNSW's graph degenerate: ties everywhere), but the data is clustered: each
base text has ~N/10,000 near copies, so a query's true top 10 is mostly copies of one or two base
texts. HNSW finds such tight clusters more easily than a million unrelated texts, and the lexical
pool sees each word ~100x more often than real text would; the recall figure printed (HNSW top
10 vs an exact scan of the tenant) is the quality measure to compare between settings, not a
promise for real data. The base vectors are cached in `--cache` (a .npy beside the text hash).

Load: COPY (psycopg's copy API) into memory_message with its secondary indexes dropped, then
the indexes built after the load (GIN, B-tree, HNSW with m / ef_construction from the model),
then ANALYZE. The tsvector is PostgreSQL's own (a generated column). Messages loaded this way
have no recorder events; the timed appends go through messages_append, events included.

Measured (in-process service calls, query embedding included: the per-process query cache is
cleared before each): memory search p50/p95 over the whole tenant (after a warm-up pass), one
user (1,000 messages), one session (100); context build with recall for a session of the big
tenant vs a 100-message tenant; messages_append p50 alone and while another process runs
whole-tenant searches back to back; HNSW recall@10 vs exact; index and table sizes; RSS of this
process (which ran every search: what a web process holding the same caches would hold).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import COLUMNS, DATA, backend_cpu_ms, pct, small_tenant
from bench_retrieval_quality import setup_django

PER_SESSION = 100
SESSIONS_PER_USER = 10
NOISE = 0.02
# Secondary indexes of memory_message dropped for the load and built after it (name → DDL).
MESSAGE_INDEXES = {
    "message_search_gin": "CREATE INDEX message_search_gin ON memory_message USING gin (search_vector) "
    "WITH (gin_pending_list_limit = 256)",
    "message_embedding_pending": "CREATE INDEX message_embedding_pending ON memory_message (created_at) "
    "WHERE embedding_status = 'pending'",
    "message_tenant_occurred": "CREATE INDEX message_tenant_occurred ON memory_message "
    "(tenant_id, occurred_at)",
}


def load_turns(path: str) -> tuple[list[dict], list[list[tuple[str, str]]]]:
    samples = json.loads(Path(path).read_text())
    conversations = [
        [
            (t["speaker"], t["text"])
            for key, value in s["conversation"].items()
            if key.startswith("session_") and isinstance(value, list)
            for t in value
        ]
        for s in samples
    ]
    return samples, conversations


def base_texts(conversations: list[list[tuple[str, str]]], count: int) -> list[str]:
    """`count` distinct real texts: two turns of one dev conversation each (seeded: reproducible)."""
    import numpy as np

    rng = np.random.default_rng(11)
    out: list[str] = []
    seen: set[tuple[int, int, int]] = set()
    while len(out) < count:
        c = int(rng.integers(0, len(conversations)))
        turns = conversations[c]
        a, b = (int(x) for x in rng.integers(0, len(turns), 2))
        if a == b or (c, a, b) in seen:
            continue
        seen.add((c, a, b))
        out.append(f"{turns[a][0]}: {turns[a][1]} {turns[b][0]}: {turns[b][1]}")
    return out


def base_vectors(texts: list[str], cache_dir: Path) -> Any:
    """The real embeddings of `texts`, from the cache when it holds them."""
    import numpy as np

    from memory.services import embedding

    embedder = embedding.embedder_get()
    key = hashlib.sha256(("\n".join(texts) + embedder.model_name).encode()).hexdigest()[:16]
    path = cache_dir / f"bench_scale_{key}.npy"
    if path.exists():
        return np.load(path)
    started = time.perf_counter()
    vectors = np.asarray(embedder.embed(texts), dtype=np.float32)
    print(f"embedded {len(texts)} base texts in {time.perf_counter() - started:.0f} s", flush=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def build_tenant(
    tenant: Any, sessions: list[Any], texts: list[str], base: Any, model: str
) -> dict[str, float]:
    """COPY the messages (indexes dropped), then build the indexes; seconds per step."""
    import numpy as np
    from django.db import connection

    from memory.models import Message, Session

    rng = np.random.default_rng(7)
    table = Message._meta.db_table
    when = datetime(2025, 1, 1, tzinfo=UTC)
    steps: dict[str, float] = {}
    hnsw_ddl = hnsw_definition()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '3GB'")
        for name in (*MESSAGE_INDEXES, "message_embedding_hnsw"):
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
        started = time.perf_counter()
        n = 0
        block = 2000
        with cursor.cursor.copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as copy:
            pending = [(s, seq) for s in sessions for seq in range(1, PER_SESSION + 1)]
            for start in range(0, len(pending), block):
                chunk = pending[start : start + block]
                picks = rng.integers(0, len(texts), len(chunk))
                vectors = base[picks] + rng.normal(0.0, NOISE, size=(len(chunk), base.shape[1]))
                vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
                for (session, seq), pick, vector in zip(chunk, picks, vectors, strict=True):
                    copy.write_row(
                        (
                            tenant.pk, session.pk, seq, "user", f"{texts[pick]} #{n}", 40, "", "", "[]", "",
                            "[]", "{}", when.isoformat(), "", (when + timedelta(seconds=30 * n)).isoformat(),
                            "english", "[" + ",".join(f"{x:.5f}" for x in vector) + "]", "completed",
                            model, 1, "",
                        )
                    )  # fmt: skip
                    n += 1
                if start and start % 100_000 == 0:
                    print(f"  copied {n} rows, {time.perf_counter() - started:.0f} s", flush=True)
        steps["copy"] = time.perf_counter() - started
        Session.objects.filter(pk__in=[s.pk for s in sessions]).update(
            message_seq=PER_SESSION, message_count=PER_SESSION
        )
        for name, ddl in {**MESSAGE_INDEXES, "message_embedding_hnsw": hnsw_ddl}.items():
            started = time.perf_counter()
            cursor.execute(ddl)
            steps[name] = time.perf_counter() - started
            print(f"  {name} built in {steps[name]:.0f} s", flush=True)
        started = time.perf_counter()
        cursor.execute(f"VACUUM (ANALYZE) {table}")
        steps["vacuum analyze"] = time.perf_counter() - started
    return steps


def hnsw_definition() -> str:
    """The HNSW index as the model declares it (m, ef_construction), built concurrently-free."""
    from django.db import connection

    from memory.models import Message

    index = next(i for i in Message._meta.indexes if i.name == "message_embedding_hnsw")
    with connection.schema_editor(collect_sql=True) as editor:
        return str(index.create_sql(Message, editor))


def sizes() -> dict[str, int]:
    """Bytes of memory_message's heap (with TOAST) and of each of its indexes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 'heap+toast', pg_table_size('memory_message') UNION ALL "
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
            "WHERE indrelid = 'memory_message'::regclass ORDER BY 2 DESC"
        )
        return dict(cursor.fetchall())


def hnsw_recall(tenant: Any, base: Any, queries: int = 20) -> float:
    """Recall@10 of the HNSW scan (ef_search and iterative scan as searches set them) vs exact."""
    import numpy as np
    from django.db import connection, transaction

    from memory.services.experience_search import configure_hnsw

    rng = np.random.default_rng(3)
    configure_hnsw()
    found = []
    sql = (
        "SELECT id FROM memory_message WHERE tenant_id = %s AND embedding IS NOT NULL "
        "ORDER BY embedding <=> %s::vector LIMIT 10"
    )
    for _ in range(queries):
        vector = base[rng.integers(0, len(base))] + rng.normal(0.0, NOISE, size=base.shape[1])
        literal = "[" + ",".join(f"{x:.5f}" for x in vector / np.linalg.norm(vector)) + "]"
        with connection.cursor() as cursor:
            cursor.execute(sql, [tenant.pk, literal])
            approx = {r[0] for r in cursor.fetchall()}
            with transaction.atomic():
                cursor.execute("SET LOCAL enable_indexscan = off")
                cursor.execute(sql, [tenant.pk, literal])
                exact = {r[0] for r in cursor.fetchall()}
        found.append(len(approx & exact) / len(exact))
    return 100 * statistics.mean(found)


def search_loop(tenant_pk: int, texts: list[str], stop: Any, count: Any) -> None:
    """In a child process: whole-tenant searches back to back until `stop` is set."""
    from memory.models import Tenant
    from memory.services import embedding
    from memory.services.memory_search import memory_search

    tenant = Tenant.objects.get(pk=tenant_pk)
    i = 0
    while not stop.is_set():
        embedding._query_cache.clear()
        memory_search(tenant=tenant, query=texts[i % len(texts)], kinds=["message"])
        i += 1
        with count.get_lock():
            count.value += 1


def append_times(tenant: Any, session: Any, n: int) -> list[float]:
    """ms per messages_append of one message to `session`."""
    from memory.services.messages import MessageInput, messages_append

    out = []
    for i in range(n):
        t0 = time.perf_counter()
        messages_append(
            tenant=tenant, session=session, items=[MessageInput(role="user", content=f"appended turn {i}")]
        )
        out.append((time.perf_counter() - t0) * 1000)
    return out


def rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--base-texts", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "ctxapp-bench"))
    parser.add_argument(
        "--keep-database",
        action="store_true",
        help="keep the bench database and reuse its tenant when it is there (needs "
        "CTXAPP_TEST_DATABASE_URL: a server that outlives the run)",
    )
    parser.add_argument("--build-only", action="store_true", help="stop once the tenant is built")
    parser.add_argument("--ef-search", type=int, default=0, help="hnsw.ef_search for this run (0: ctxapp's)")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    setup_django(keep=args.keep_database)

    from django.db import connection, connections

    from memory.models import Message, Session, Tenant
    from memory.services import embedding, experience_search
    from memory.services.context import context_build
    from memory.services.memory_search import SearchScope, memory_search
    from memory.services.sessions import session_create

    if args.ef_search:
        experience_search.HNSW_EF_SEARCH = args.ef_search
    samples, conversations = load_turns(args.data)
    texts = base_texts(conversations, args.base_texts)
    base = base_vectors(texts, Path(args.cache))
    questions = [q["question"] for s in samples for q in s["qa"]][: args.queries]
    turns = [turn for conversation in conversations for turn in conversation]

    big = Tenant.objects.filter(slug="scale").first()
    if big is not None and Message.objects.filter(tenant=big).count() >= args.messages:
        print(f"reusing the kept tenant of {Message.objects.filter(tenant=big).count()} messages", flush=True)
    else:
        if big is not None:
            raise SystemExit("the kept database holds a smaller tenant: drop it (without --keep-database)")
        big = Tenant.objects.create(name="scale", slug="scale")
        started = time.perf_counter()
        # One session through the service (the agent, the tenant's retention defaults), the rest
        # as copies of it in bulk: 10,000 session_create calls take minutes on a loaded machine.
        first = session_create(tenant=big, agent_external_id="bot", user_id="u0")
        copies = [
            Session(
                tenant=big, agent=first.agent, user_id=f"u{i // SESSIONS_PER_USER}",
                idle_ttl_seconds=first.idle_ttl_seconds, expires_at=first.expires_at,
            )
            for i in range(1, max(1, args.messages // PER_SESSION))
        ]  # fmt: skip
        sessions = [first, *Session.objects.bulk_create(copies, batch_size=2000)]
        made = time.perf_counter() - started
        print(f"{len(sessions)} sessions in {made:.0f} s", flush=True)
        steps = build_tenant(big, sessions, texts, base, embedding.embedder_get().model_name)
        steps = {"sessions": made, **steps}
        print(
            "build, s: "
            + ", ".join(f"{k} {v:.0f}" for k, v in steps.items())
            + f"; total {sum(steps.values()):.0f}",
            flush=True,
        )
    n = Message.objects.filter(tenant=big).count()
    print("sizes, MB: " + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in sizes().items()), flush=True)
    if args.build_only:
        return

    cpu: dict[str, tuple[float, float]] = {}  # name → CPU ms per call: this process, its backend

    def timed(fn: Callable[[str], object], items: list[str], name: str = "") -> list[float]:
        out = []
        started = (time.process_time(), backend_cpu_ms())
        for q in items:
            embedding._query_cache.clear()
            t0 = time.perf_counter()
            fn(q)
            out.append((time.perf_counter() - t0) * 1000)
        if name:
            mine, backend = time.process_time() - started[0], backend_cpu_ms() - started[1]
            cpu[name] = (mine * 1000 / len(items), backend / len(items))
        return out

    rss_start = rss_mb()
    small, small_session = small_tenant(turns)
    for q in questions[:3]:
        context_build(tenant=small, session=small_session, next_input=q)
    small_build = timed(lambda q: context_build(tenant=small, session=small_session, next_input=q), questions)

    # The newest session as built (100 messages, all embedded), not an earlier run's appender.
    built = Session.objects.filter(tenant=big, message_seq=PER_SESSION).exclude(user_id="appender")
    target = built.order_by("-pk").first()
    assert target is not None
    user_scope = SearchScope(user_id=target.user_id)
    session_scope = SearchScope(session=target.public_id, sessions="current")
    memory_search(tenant=big, query=questions[0], scope=user_scope)
    memory_search(tenant=big, query=questions[0], scope=session_scope)
    user_search = timed(
        lambda q: memory_search(tenant=big, query=q, scope=user_scope, kinds=["message"]), questions, "user"
    )
    session_search = timed(
        lambda q: memory_search(tenant=big, query=q, scope=session_scope, kinds=["message"]), questions
    )
    # Warm the buffers as a running server has them (other texts than the timed questions).
    warm = [text for _, text in turns[::5]][: max(50, len(questions))]
    warm_up = timed(lambda q: memory_search(tenant=big, query=q, kinds=["message"]), warm)
    whole = lambda q: memory_search(tenant=big, query=q, kinds=["message"])  # noqa: E731
    tenant_search = timed(whole, questions, "tenant")
    for q in questions[:3]:
        context_build(tenant=big, session=target, next_input=q)
    big_build = timed(lambda q: context_build(tenant=big, session=target, next_input=q), questions)
    recall = hnsw_recall(big, base)
    rss_after = rss_mb()

    # Appends: alone, then while a second process runs whole-tenant searches back to back.
    # A user of its own: the appended messages (never embedded here, no worker runs) must not
    # grow the searched user's scope from one --keep-database run to the next.
    appender = session_create(tenant=big, agent_external_id="bot", user_id="appender")
    append_times(big, appender, 20)
    cpu_started = (time.process_time(), backend_cpu_ms())
    alone = append_times(big, appender, args.appends)
    append_cpu = (
        (time.process_time() - cpu_started[0]) * 1000 / args.appends,
        (backend_cpu_ms() - cpu_started[1]) / args.appends,
    )
    connections.close_all()  # the child opens its own connection (a forked one is shared)
    context = multiprocessing.get_context("fork")
    stop, count = context.Event(), context.Value("i", 0)
    child = context.Process(target=search_loop, args=(big.pk, warm, stop, count))
    child.start()
    deadline = time.monotonic() + 120
    while count.value < 5 and time.monotonic() < deadline and child.is_alive():
        time.sleep(0.05)  # polling for the child's first searches, under a deadline
    searching_since = time.perf_counter()
    during = append_times(big, appender, args.appends)
    searched = count.value
    searching_for = time.perf_counter() - searching_since
    stop.set()
    child.join(60)
    connection.ensure_connection()

    def row(name: str, values: list[float]) -> str:
        return f"{name:<62} p50 {statistics.median(values):7.1f} ms   p95 {pct(values, 0.95):7.1f} ms"

    print(f"\n{n} messages in the tenant; {len(questions)} queries each; query embedding included")
    print(row("memory_search, scope one session (100 messages)", session_search))
    print(row("memory_search, scope one user (1,000 messages)", user_search))
    print(row(f"warm-up: whole tenant, {len(warm)} turn texts as queries", warm_up))
    print(row(f"memory_search, whole tenant ({n} messages)", tenant_search))
    for name, (mine, backend) in cpu.items():
        print(f"  CPU per search, scope {name}: this process {mine:.1f} ms (query embedding included), "
              f"its PostgreSQL backend {backend:.1f} ms")  # fmt: skip
    print(row("context_build + recall, tenant of 100 messages", small_build))
    print(row("context_build + recall, a user's session in the big tenant", big_build))
    print(f"ratio of build p50s: {statistics.median(big_build) / statistics.median(small_build):.2f}")
    print(row("messages_append (one message), alone", alone))
    print(f"  CPU per append: this process {append_cpu[0]:.1f} ms, PostgreSQL backend {append_cpu[1]:.1f} ms")
    print(row("messages_append, while another process searches", during))
    print(f"  searches in the other process meanwhile: {searched / searching_for:.1f}/s")
    ef = args.ef_search or experience_search.HNSW_EF_SEARCH
    print(f"HNSW recall@10 vs exact (ef_search {ef}, iterative scan): {recall:.1f} %")
    print(f"RSS of this process: {rss_start:.0f} MB before the searches, {rss_after:.0f} MB after")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
