"""Latency under load, open loop: append, memory search and context build at fixed arrival rates.

    python bench/bench_load.py                          # starts its own database and `ctxapp web`
    python bench/bench_load.py --duration 20 --schedule uniform
    python bench/bench_load.py --url http://127.0.0.1:8000 --key ck_... --session S --user U

First each operation's capacity: the throughput of `--clients` closed-loop clients (each sends
its next request when the last one answered) for `--duration` seconds. Then the operation alone at
25 %, 50 % and 75 % of that capacity, open loop: requests are sent on a fixed schedule (Poisson
arrivals by default, `--schedule uniform` for evenly spaced ones) whatever the server does, and
each latency is measured from the request's scheduled send time, so time spent queueing (in the
client's connection pool, the server's accept queue, a worker's event loop, PostgreSQL) counts.
A closed loop hides exactly that: a slow answer delays the next request instead of piling up.

Started by the script (default): the embedded PostgreSQL in a temporary directory, the schema, a
tenant, and uvicorn on ctxapp.asgi with `--workers` processes (ctxapp's settings, rate limits
raised so they never answer 429 here; their counting still runs). The tenant holds the LoCoMo
dev conversations (998 turns, one session per dev session, one user per conversation), embedded
in-process before the load starts. Appends go round-robin to 32 sessions of their own (one
message each, with an Idempotency-Key, as the client sends them); searches are POST
/memory/search over the whole tenant; context builds are POST /sessions/{id}/context with recall
on, for the dev sessions in turn. Every search / build text is distinct (the dev questions under
16 prefixes: 3,200 texts), so the servers' query-embedding caches (512 per process) never answer.

At 75 % it also says where the time goes: CPU ms per request of the web processes, of
PostgreSQL's processes and of this client, sampled from /proc, and the rest of the latency
(waiting: for a core, a lock, the network), beside the p50 of one closed-loop client (the
service time without queueing). The machine's load average is printed: other work on it takes
cores from the server.
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ingest import free_port, percentile, prepare, start_server
from bench_memory import DATA

PREFIXES = [
    "", "Tell me: ", "Quick question: ", "Remind me, ", "Do you recall ", "I forgot, ", "Can you check: ",
    "Help me remember: ", "From our chats, ", "Earlier you said something; ", "Looking back, ",
    "One more thing: ", "Out of curiosity, ", "Before I forget, ", "Hey, ", "So, ",
]  # fmt: skip


@dataclass
class Target:
    base: str
    secret: str
    sessions: list[str]  # the dev sessions (context builds)
    append_sessions: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    counter: int = 0

    def text(self) -> str:
        self.counter += 1
        return self.texts[self.counter % len(self.texts)]


def client_for(target: Target) -> Any:
    import httpx

    from ctxapp.client import AsyncClient

    # Enough connections that the client's pool is never the queue being measured.
    transport = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=500, max_keepalive_connections=500)
    )
    return AsyncClient(target.base, target.secret, retries=0, timeout=120, transport=transport)


def operation(name: str, api: Any, target: Target) -> Callable[[], Awaitable[Any]]:
    if name == "append":

        def append() -> Awaitable[Any]:
            session = target.append_sessions[target.counter % len(target.append_sessions)]
            target.counter += 1
            return api.message_append(
                session, role="user", content=f"turn {target.counter}: what did we decide about the trip?",
                idempotency_key=str(uuid.uuid4()),
            )  # fmt: skip

        return append
    if name == "search":
        return lambda: api.memory_search(target.text(), kinds=["message"])
    if name == "context":

        def build() -> Awaitable[Any]:
            session = target.sessions[target.counter % len(target.sessions)]
            return api.context_build(session, target.text(), recall={"enabled": True})

        return build
    raise SystemExit(f"unknown operation {name!r}")


async def closed_loop(name: str, target: Target, clients: int, duration: float) -> tuple[float, list[float]]:
    """(requests/s, latencies in ms) of `clients` closed-loop clients for `duration` seconds."""
    latencies: list[float] = []
    async with client_for(target) as api:
        send = operation(name, api, target)
        await asyncio.gather(*(send() for _ in range(clients)))  # warm-up: connections, caches
        stop = time.perf_counter() + duration

        async def loop() -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await send()
                latencies.append((time.perf_counter() - t0) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, latencies


def schedule(rate: float, duration: float, kind: str, rng: random.Random) -> list[float]:
    """Send offsets (s) of an open-loop run: Poisson arrivals or evenly spaced ones."""
    if kind == "uniform":
        return [i / rate for i in range(int(rate * duration))]
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass
class OpenResult:
    rate: float
    sent: int
    errors: int
    latencies: list[float]
    late_ms: float  # the client's own lag: p99 of (actual send - scheduled send)
    elapsed: float


async def open_loop(
    name: str, target: Target, rate: float, duration: float, kind: str, seed: int
) -> OpenResult:
    offsets = schedule(rate, duration, kind, random.Random(seed))
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0
    async with client_for(target) as api:
        send = operation(name, api, target)
        await send()  # warm-up

        async def one(scheduled: float) -> None:
            nonlocal errors
            lags.append((time.perf_counter() - scheduled) * 1000)
            try:
                await send()
            except Exception:  # a failed request is counted, not timed
                errors += 1
                return
            latencies.append((time.perf_counter() - scheduled) * 1000)

        tasks = []
        start = time.perf_counter() + 0.05
        for offset in offsets:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule itself, not a wait for a condition
            tasks.append(asyncio.create_task(one(start + offset)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    return OpenResult(rate, len(offsets), errors, latencies, percentile(lags, 0.99) if lags else 0.0, elapsed)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (and their children: PostgreSQL's backends)."""
    import psutil

    total = 0.0
    seen: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                if proc.pid in seen:
                    continue
                seen.add(proc.pid)
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def postmaster_pid() -> int | None:
    """The pid of the embedded PostgreSQL this script started (its postmaster.pid)."""
    from ctxapp.infra import embedded

    path = embedded.pgdata_dir(Path(os.environ["CTXAPP_DATA_DIR"])) / "postmaster.pid"
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def seed(target_base: str, secret: str) -> Target:
    """The dev conversations through the API, embedded in-process; 32 sessions for appends."""
    import httpx

    from ctxapp.client import Client
    from memory.services import message_indexing

    samples = json.loads(Path(DATA).read_text())
    sessions: list[str] = []
    with Client(target_base, secret, transport=httpx.HTTPTransport()) as api:
        for number, sample in enumerate(samples):
            for key, value in sample["conversation"].items():
                if not key.startswith("session_") or not isinstance(value, list) or not value:
                    continue
                session = api.session_create("bot", user_id=f"user{number}")["id"]
                api.messages_append(
                    session, [{"role": "user", "name": t["speaker"], "content": t["text"]} for t in value]
                )
                sessions.append(session)
        appends = [api.session_create("bot", user_id="appender")["id"] for _ in range(32)]
    started = time.perf_counter()
    message_indexing.memory_index_drain()
    print(f"seeded {len(sessions)} sessions, embedded in {time.perf_counter() - started:.0f} s", flush=True)
    questions = [q["question"] for s in samples for q in s["qa"]]
    texts = [f"{prefix}{q}" for prefix in PREFIXES for q in questions]
    random.Random(5).shuffle(texts)
    return Target(target_base, secret, sessions, appends, texts)


def _target(args: argparse.Namespace) -> tuple[Target, subprocess.Popen[bytes] | None]:
    """What to load: a running server (`--url`), or a fresh one started and seeded here."""
    server = None
    if args.url:
        if not (args.key and args.session):
            raise SystemExit("--url needs --key and at least one --session")
        questions = [q["question"] for s in json.loads(Path(DATA).read_text()) for q in s["qa"]]
        texts = [f"{prefix}{q}" for prefix in PREFIXES for q in questions]
        target = Target(args.url, args.key, args.session, args.session, texts)
    else:
        data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-load-"))
        atexit.register(shutil.rmtree, data_dir, True)  # after pgserver's own exit hook
        os.environ["CTXAPP_DATA_DIR"] = str(data_dir)
        os.environ.setdefault("CTXAPP_SECRET_KEY", "bench-secret-key")
        os.environ.setdefault("CTXAPP_LOG_LEVEL", "warning")
        os.environ.setdefault("CTXAPP_QUEUE_PREFIX", f"ctxload{os.getpid()}")
        os.environ.setdefault("CTXAPP_THROTTLE_KEY_RATE", "1000000/min")
        os.environ.setdefault("CTXAPP_THROTTLE_ADDRESS_RATE", "1000000/min")
        secret = prepare(data_dir)
        port = free_port()
        server = start_server(port, args.workers, "ctxapp.settings")
        target = seed(f"http://127.0.0.1:{port}", secret)
    return target, server


def _measure(
    name: str,
    target: Target,
    args: argparse.Namespace,
    server: subprocess.Popen[bytes] | None,
    pg: int | None,
    cores: int,
) -> None:
    """One operation: its closed-loop capacity, then each fraction of it at a fixed arrival rate."""
    rps, closed = asyncio.run(closed_loop(name, target, args.clients, args.duration))
    _, single = asyncio.run(closed_loop(name, target, 1, min(args.duration, 8)))
    load = os.getloadavg()[0]
    print(f"{name:<8} {'capacity':>10} {rps:>9.1f} {len(closed):>6} {0:>4} {statistics.median(closed):>8.1f} "
          f"{percentile(closed, 0.99):>8.1f} {'':>14}  {load:.1f}   ({rps / cores:.1f}/s per core; "
          f"one client: p50 {statistics.median(single):.1f} ms, {1000 / statistics.median(single):.0f}/s)", flush=True)  # fmt: skip
    for fraction in (float(x) for x in args.fractions.split(",")):
        watched = [p for p in (server.pid if server else None, pg) if p]
        cpu_before = [cpu_seconds([server.pid]) if server else 0.0, cpu_seconds([pg]) if pg else 0.0]
        client_before = time.process_time()
        r = asyncio.run(
            open_loop(name, target, fraction * rps, args.duration, args.schedule, seed=int(fraction * 100))
        )
        load = os.getloadavg()[0]
        label = f"{fraction:.0%} {r.rate:.1f}/s"
        print(f"{name:<8} {label:>10} {len(r.latencies) / r.elapsed:>9.1f} {r.sent:>6} {r.errors:>4} "
              f"{statistics.median(r.latencies):>8.1f} {percentile(r.latencies, 0.99):>8.1f} {r.late_ms:>14.1f}  {load:.1f}", flush=True)  # fmt: skip
        if fraction >= 0.75 and watched and r.latencies:
            web = (cpu_seconds([server.pid]) - cpu_before[0]) * 1000 / r.sent if server else float("nan")
            db = (cpu_seconds([pg]) - cpu_before[1]) * 1000 / r.sent if pg else float("nan")
            mine = (time.process_time() - client_before) * 1000 / r.sent
            mean = statistics.mean(r.latencies)
            print(f"         where the time goes at {fraction:.0%} (per request): mean latency {mean:.1f} ms = "
                  f"web CPU {web:.1f} + PostgreSQL CPU {db:.1f} + client CPU {mine:.1f} + waiting "
                  f"{mean - web - db - mine:.1f}; busy {r.rate * (web + db + mine) / 10 / cores:.0f} % of "
                  f"{cores} cores; service time alone (one client) p50 {statistics.median(single):.1f} ms", flush=True)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", default="append,search,context")
    parser.add_argument("--fractions", default="0.25,0.5,0.75", help="of each operation's capacity")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per measurement (default 15)")
    parser.add_argument(
        "--clients", type=int, default=8, help="closed-loop clients for the capacity (default 8)"
    )
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes (default 2)")
    parser.add_argument("--schedule", choices=["poisson", "uniform"], default="poisson")
    parser.add_argument("--url", help="a running ctxapp web (then --key and --session are needed)")
    parser.add_argument("--key")
    parser.add_argument("--session", action="append", default=[], help="a session for appends and builds")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    target, server = _target(args)
    cores = os.cpu_count() or 1
    print(f"{args.workers} web worker(s), {cores} cores, {args.duration:.0f} s per measurement, "
          f"{args.clients} closed-loop clients for the capacity, {args.schedule} arrivals", flush=True)  # fmt: skip
    pg = postmaster_pid() if server else None
    try:
        print(
            f"\n{'op':<8} {'rate':>10} {'achieved':>9} {'n':>6} {'err':>4} {'p50 ms':>8} {'p99 ms':>8} {'client lag p99':>14}  load"
        )
        for name in args.ops.split(","):
            _measure(name, target, args, server, pg, cores)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
            from django.db import connections

            connections.close_all()
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
