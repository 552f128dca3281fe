"""What one request costs: CPU, SQL statements and latency per operation of a running `ctxapp up`.

    python bench/bench_cost.py                  # ~4 min on a fresh data directory
    python bench/bench_cost.py --rounds 3       # quicker, less sure of the medians
    python bench/bench_cost.py --keep           # keep the data directory (the server's log in it)

What it does:
1. Starts the embedded PostgreSQL in a temporary data directory and turns on, with ALTER SYSTEM
   on that throw-away server, `log_statement = all` and a `log_line_prefix` that carries the
   client's application_name; then `ctxapp up` on the same directory (the embedded Redis
   engine, web, worker, beat). `up` names each child's connections (PGAPPNAME=ctxapp-web,
   ctxapp-worker, ctxapp-beat), so every statement in the server's log says which process sent
   it. The web process runs bench/floor_settings.py: ctxapp's URLs plus the floor endpoints.
2. Seeds one user: 1,000 messages (the LoCoMo dev turns) in 10 sessions, 12 user memories; waits
   until the worker has embedded every message.
3. Idle: 30 s with no request; statements per second of each process, and CPU per second.
4. Rounds: each operation in turn (the order rotates each round) for a window of requests, one
   client, one request after another over a kept-alive connection. Per window: CPU of the web
   process tree and of the PostgreSQL backends it holds (psutil, process CPU times, deltas over
   the window), the web's statements (counted in the server's log), wall time per request; then
   it waits until the worker is idle and takes the worker's CPU (its process and its backends)
   over the same span, less its idle rate: the jobs the operation implies.

Operations:
- `floor GET`: a bare DRF view behind key authentication, permission and throttles
  (bench/floor_urls.py), no database: the framework's own cost, what every endpoint pays;
- `floor INSERT`: the same view doing one ORM `create()` of a message;
- `GET /tenant`: authenticated, the tenant's description;
- `append`: one message, with an Idempotency-Key (as the Python client sends every write);
- `search`: memory search of the user's messages, a distinct query each time (the LoCoMo dev
  questions under prefixes, so the query-embedding cache never answers);
- `search, repeated`: the same query each time (its embedding comes from the cache);
- `build`: context build of a session of the user with recall on, the user profile and the manifest.

Printed: one table, medians over the rounds with [min-max] beside the CPU, and p50/p99 over
every request; the load average. CPU is process time (user + system), so it depends less on
what else the machine runs than wall time does; on a loaded machine both still grow.
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ctxapp.client import Client  # noqa: E402
from ctxapp.infra import embedded  # noqa: E402

DEV = ROOT / "tests" / "data" / "dev" / "conversations_dev.locomo.json"
LOG_PREFIX = "@@%a@@%p@@ "
STATEMENT = re.compile(r"^@@([^@]*)@@(\d+)@@ LOG:  (?:statement|execute [^:]*):")
APPS = ("ctxapp-web", "ctxapp-worker", "ctxapp-beat")
BENCH_APP = "ctxapp-bench"
PREFIXES = [
    "",
    "Tell me: ",
    "Remind me, ",
    "Do you recall: ",
    "From our chats, ",
    "Quick question: ",
    "Hey, ",
    "So, ",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load() -> float:
    return os.getloadavg()[0]


# --- the stack --------------------------------------------------------------------------------


@dataclass
class Stack:
    data: Path
    pg_uri: str  # the ctxapp database, as the bench's own client (application_name ctxapp-bench)
    log: Path
    up: subprocess.Popen[bytes] | None = None
    output: list[str] = field(default_factory=list)
    base: str = ""
    api_key: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    conn: Any = None

    def sql(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(query, params).fetchall())


def start_postgres(data: Path) -> tuple[Any, str]:
    server = embedded.start_server(embedded.pgdata_dir(data), cleanup_mode="stop")
    uri = embedded.prepare_database(server.get_uri(), embedded.DATABASE_NAME)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute(f"ALTER SYSTEM SET log_line_prefix = '{LOG_PREFIX}'")
        conn.execute("SELECT pg_reload_conf()")
    return server, uri


def start_up(stack: Stack, port: int) -> None:
    env = {
        **os.environ,
        "CTXAPP_DATA_DIR": str(stack.data),
        "CTXAPP_EMBEDDED_DATABASE_URL": stack.pg_uri,  # the server started above: `up` uses it as is
        "DJANGO_SETTINGS_MODULE": "bench.floor_settings",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        # Limits far above this client's rate: their counting still runs on every request.
        "CTXAPP_THROTTLE_KEY_RATE": "10000000/min",
        "CTXAPP_THROTTLE_ADDRESS_RATE": "10000000/min",
        "CTXAPP_PORT": str(port),
    }
    # `up` names each child's connections itself (ctxapp-web, ctxapp-worker, ctxapp-beat).
    for name in ("DATABASE_URL", "REDIS_URL", "CTXAPP_QUEUE_PREFIX", "PGAPPNAME"):
        env.pop(name, None)
    command = [
        str(Path(sys.executable).with_name("ctxapp")),
        "up",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    stack.up = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ready = threading.Event()

    def read() -> None:
        assert stack.up is not None and stack.up.stdout is not None
        for raw in stack.up.stdout:
            line = raw.decode(errors="replace").rstrip()
            stack.output.append(line)
            if "Ctrl-C stops everything." in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 180
    while not ready.wait(0.5):
        if stack.up.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("ctxapp up did not start:\n" + "\n".join(stack.output[-40:]))
    found = re.search(r"API key\s+(ctx_\S+)", "\n".join(stack.output))
    if not found:
        raise SystemExit("no API key in ctxapp up's banner:\n" + "\n".join(stack.output[-40:]))
    stack.api_key = found[1]
    stack.base = f"http://127.0.0.1:{port}"
    processes = json.loads((stack.data / "up.json").read_text())["processes"]
    stack.pids = {name: int(record["pid"]) for name, record in processes.items()}


def stop_up(stack: Stack) -> None:
    if stack.up is not None and stack.up.poll() is None:
        stack.up.send_signal(signal.SIGINT)
        try:
            stack.up.wait(60)
        except subprocess.TimeoutExpired:
            stack.up.kill()


# --- measuring --------------------------------------------------------------------------------


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants now."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def backends(stack: Stack) -> dict[int, str]:
    """Client backends of the server: pid -> application_name (the bench's own left out)."""
    rows = stack.sql(
        "SELECT pid, application_name FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    return {int(pid): str(app) for pid, app in rows}


def backend_cpu(pids: dict[int, str]) -> dict[int, float]:
    out = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[pid] = times.user + times.system
    return out


@dataclass
class Snapshot:
    at: float
    web: float
    worker: float
    apps: dict[int, str]
    pg: dict[int, float]
    log_offset: int


def snapshot(stack: Stack) -> Snapshot:
    apps = backends(stack)
    return Snapshot(
        at=time.perf_counter(),
        web=tree_cpu(stack.pids["web"]),
        worker=tree_cpu(stack.pids["worker"]),
        apps=apps,
        pg=backend_cpu(apps),
        log_offset=stack.log.stat().st_size,
    )


def pg_delta(before: Snapshot, after: Snapshot, app: str) -> float:
    """CPU seconds the backends of `app` used between the snapshots (a backend that ended in
    between is lost: the pools keep theirs, so few do)."""
    return sum(
        cpu - before.pg.get(pid, 0.0)
        for pid, cpu in after.pg.items()
        if after.apps.get(pid) == app or before.apps.get(pid) == app
    )


def statements(stack: Stack, start: int, end: int) -> Counter[str]:
    with stack.log.open("rb") as handle:
        handle.seek(start)
        text = handle.read(end - start).decode(errors="replace")
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        found = STATEMENT.match(line)
        if found:
            counts[found[1] or "(unnamed)"] += 1
    return counts


def statement_lines(stack: Stack, start: int, end: int, app: str) -> list[str]:
    with stack.log.open("rb") as handle:
        handle.seek(start)
        text = handle.read(end - start).decode(errors="replace")
    return [
        f"[{found[2]}] " + line[found.end() :].strip()
        for line in text.splitlines()
        if (found := STATEMENT.match(line)) and found[1] == app
    ]


def worker_idle(stack: Stack, timeout: float = 60.0) -> None:
    """Until no job and no message waits for the worker, and its CPU has settled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        [(jobs, pending)] = stack.sql(
            "SELECT (SELECT count(*) FROM memory_jobintent WHERE status IN ('pending', 'running')"
            "        AND (run_after IS NULL OR run_after <= now())),"
            "       (SELECT count(*) FROM memory_message WHERE embedding_status = 'pending')"
        )
        if jobs == 0 and pending == 0:
            before = tree_cpu(stack.pids["worker"])
            time.sleep(0.5)
            if tree_cpu(stack.pids["worker"]) - before < 0.02:
                return
        else:
            time.sleep(0.2)


# --- the operations ---------------------------------------------------------------------------


@dataclass
class Op:
    key: str
    name: str
    run: Callable[[int], Any]
    n: int


@dataclass
class Window:
    web_ms: float
    pg_ms: float
    worker_ms: float
    statements: float
    load: float


@dataclass
class Result:
    windows: list[Window] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def measure(stack: Stack, op: Op, result: Result, worker_idle_rate: float) -> None:
    worker_idle(stack)
    before = snapshot(stack)
    for i in range(op.n):
        started = time.perf_counter()
        op.run(i)
        result.latencies.append(time.perf_counter() - started)
    after = snapshot(stack)
    worker_idle(stack)
    done = snapshot(stack)
    worker = (
        done.worker - before.worker + pg_delta(before, done, "ctxapp-worker")
        - worker_idle_rate * (done.at - before.at)
    )  # fmt: skip
    counts = statements(stack, before.log_offset, after.log_offset)
    result.windows.append(
        Window(
            web_ms=(after.web - before.web) * 1000 / op.n,
            pg_ms=pg_delta(before, after, "ctxapp-web") * 1000 / op.n,
            worker_ms=max(0.0, worker) * 1000 / op.n,
            statements=counts["ctxapp-web"] / op.n,
            load=load(),
        )
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def conversations() -> list[dict[str, Any]]:
    return list(json.loads(DEV.read_text()))


def seed(stack: Stack, api: Client, messages: int) -> tuple[list[str], str, list[str]]:
    """One user's `messages` turns in 10 sessions, and 12 memories about the user. Returns
    (session ids, the user, distinct queries)."""
    samples = conversations()
    turns = [
        (turn.get("speaker", "user"), turn["text"])
        for sample in samples
        for key, value in sample["conversation"].items()
        if key.startswith("session_") and isinstance(value, list)
        for turn in value
    ]
    while len(turns) < messages:
        turns += turns
    turns = turns[:messages]
    user = "bench-user"
    sessions = [api.session_create("bench-agent", user_id=user)["id"] for _ in range(10)]
    per = -(-messages // len(sessions))
    for index, session in enumerate(sessions):
        chunk = turns[index * per : (index + 1) * per]
        for start in range(0, len(chunk), 100):
            api.messages_append(
                session,
                [
                    {"role": "user" if n % 2 == 0 else "assistant", "content": f"{speaker}: {text}"}
                    for n, (speaker, text) in enumerate(chunk[start : start + 100], start)
                ],
            )
    facts = [
        ("diet", "vegetarian, no fish", "constraint"), ("coffee", "oat flat white", "preference"),
        ("home city", "Lisbon", "profile"), ("job", "urban planner", "profile"),
        ("pet", "a retired racing greyhound called Biscuit", "fact"), ("running", "training for a marathon in May", "plan"),
        ("language", "learning Japanese", "fact"), ("travel", "no overnight flights", "constraint"),
        ("music", "jazz piano", "preference"), ("partner", "Mei", "fact"),
        ("car", "sold it, cycles to work", "decision"), ("birthday", "14 March", "profile"),
    ]  # fmt: skip
    for subject, text, kind in facts:
        api.user_memory_create(user, subject, text, type=kind)
    questions = [qa["question"] for sample in samples for qa in sample.get("qa", [])]
    queries = [prefix + question for prefix in PREFIXES for question in questions]
    return sessions, user, queries


def run(args: argparse.Namespace) -> None:
    data = Path(tempfile.mkdtemp(prefix="ctxapp-bench-cost-"))
    if not args.keep:
        atexit.register(shutil.rmtree, data, ignore_errors=True)
    began = time.monotonic()
    loads = [load()]
    server, uri = start_postgres(data)
    stack = Stack(data=data, pg_uri=uri, log=embedded.pgdata_dir(data) / "log")
    atexit.register(server.stop)
    port = args.port or free_port()
    start_up(stack, port)
    atexit.register(stop_up, stack)
    stack.conn = psycopg.connect(uri, autocommit=True, application_name=BENCH_APP)
    print(f"ctxapp up on {stack.base}, data {data} ({time.monotonic() - began:.0f} s)", flush=True)

    api = Client(stack.base, stack.api_key, retries=0, timeout=120)
    raw = httpx.Client(base_url=stack.base, headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=120)
    sessions, user, queries = seed(stack, api, args.messages)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = raw.get("/api/v1/memory/index").json()
        if status.get("pending", 0) == 0:
            break
        time.sleep(1)
    worker_idle(stack)
    print(
        f"seeded {args.messages} messages of one user, embedded: {status} ({time.monotonic() - began:.0f} s)",
        flush=True,
    )

    # Idle: nothing asks anything.
    loads.append(load())
    before = snapshot(stack)
    time.sleep(args.idle)
    after = snapshot(stack)
    loads.append(load())
    seconds = after.at - before.at
    idle_counts = statements(stack, before.log_offset, after.log_offset)
    worker_idle_rate = (after.worker - before.worker + pg_delta(before, after, "ctxapp-worker")) / seconds
    idle = {
        "statements": sum(idle_counts[app] for app in idle_counts if app != BENCH_APP) / seconds,
        "by_app": {app: idle_counts[app] / seconds for app in sorted(idle_counts) if app != BENCH_APP},
        "web_ms": (after.web - before.web) * 1000 / seconds,
        "worker_ms": worker_idle_rate * 1000,
        "pg_ms": sum(pg_delta(before, after, app) for app in APPS) * 1000 / seconds,
    }
    print(f"idle {seconds:.0f} s: {idle['statements']:.2f} statements/s {idle['by_app']}", flush=True)

    [(floor_session,)] = stack.sql("SELECT id FROM memory_session WHERE public_id = %s", [sessions[0]])
    appends = api.session_create("bench-agent", user_id=user)["id"]
    counter = iter(range(10**9))

    def check(response: httpx.Response, status: int = 200) -> None:
        if response.status_code != status:
            raise SystemExit(f"{response.request.url}: {response.status_code} {response.text[:300]}")

    def floor_get(i: int) -> None:
        check(raw.get("/bench/floor"))

    def floor_insert(i: int) -> None:
        check(
            raw.post(f"/bench/floor/{floor_session}", json={"role": "user", "content": f"floor turn {i}"}),
            201,
        )

    def tenant_get(i: int) -> None:
        check(raw.get("/api/v1/tenant"))

    def append(i: int) -> None:
        api.message_append(
            appends, role="user", content=f"turn {next(counter)}: what did we decide about the trip?"
        )

    def search(i: int) -> None:
        api.memory_search(queries[next(counter) % len(queries)], scope={"user_id": user}, kinds=["message"])

    def search_again(i: int) -> None:
        api.memory_search(queries[0], scope={"user_id": user}, kinds=["message"])

    def build(i: int) -> None:
        built = api.context_build(
            sessions[i % len(sessions)], queries[next(counter) % len(queries)], recall={"enabled": True}
        )
        if not built.get("manifest"):
            raise SystemExit(f"a build without its manifest: {sorted(built)}")

    ops = [
        Op("floor", "floor GET (bare DRF view)", floor_get, args.ops),
        Op("insert", "floor INSERT (bare view, one create())", floor_insert, args.ops),
        Op("tenant", "GET /api/v1/tenant", tenant_get, args.ops),
        Op("append", "append one message", append, args.ops),
        Op("search", "memory search, distinct queries", search, args.ops),
        Op("repeat", "memory search, repeated query", search_again, args.ops),
        Op("build", "context build (recall, profile, manifest)", build, max(5, args.ops // 2)),
    ]
    if args.only:
        ops = [op for op in ops if op.key in args.only.split(",")]
    # Warm-up: each operation a few times (connections, caches, the embedder in the web process).
    for op in ops:
        for i in range(3):
            op.run(i)
    if args.statements:
        for op in ops:
            offset = stack.log.stat().st_size
            op.run(0)
            print(f"\n{op.name}: the web's statements")
            for line in statement_lines(stack, offset, stack.log.stat().st_size, "ctxapp-web"):
                print(f"  {line[: args.width]}")
        return
    if args.profile:
        profile(stack, next(op for op in ops if op.key == args.profile), args.profile_seconds, data)
        return
    results = {op.name: Result() for op in ops}
    for round_ in range(args.rounds):
        for op in ops[round_ % len(ops) :] + ops[: round_ % len(ops)]:
            measure(stack, op, results[op.name], worker_idle_rate)
        loads.append(load())
        print(
            f"round {round_ + 1}/{args.rounds} done ({time.monotonic() - began:.0f} s, load {load():.1f})",
            flush=True,
        )
    api.close()
    raw.close()
    report(results, idle, loads, args, time.monotonic() - began)


def report(
    results: dict[str, Result],
    idle: dict[str, Any],
    loads: list[float],
    args: argparse.Namespace,
    took: float,
) -> None:
    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):6.2f} [{min(values):.2f}-{max(values):.2f}]"

    print()
    print(
        f"bench_cost: {args.messages} messages of one user, {args.rounds} rounds, {args.ops} requests per window "
        f"(builds {max(5, args.ops // 2)}), one client; load {min(loads):.1f}-{max(loads):.1f}; {took:.0f} s"
    )
    header = f"| {'operation':<42} | {'web CPU ms':>22} | {'PG CPU ms':>22} | {'worker CPU ms':>14} | {'statements':>10} | {'p50 ms':>7} | {'p99 ms':>7} | {'per core':>8} |"
    print(header)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|")
    for name, result in results.items():
        web = [w.web_ms for w in result.windows]
        pg = [w.pg_ms for w in result.windows]
        cpu = statistics.median([w.web_ms + w.pg_ms for w in result.windows])
        print(
            f"| {name:<42} | {spread(web):>22} | {spread(pg):>22} | {statistics.median([w.worker_ms for w in result.windows]):14.2f} "
            f"| {statistics.median([w.statements for w in result.windows]):10.1f} "
            f"| {percentile(result.latencies, 0.5) * 1000:7.2f} | {percentile(result.latencies, 0.99) * 1000:7.2f} "
            f"| {1000 / cpu if cpu else 0:6.0f}/s |"
        )
    by_app = ", ".join(f"{app} {rate:.2f}" for app, rate in idle["by_app"].items()) or "none"
    print(
        f"| idle server, {args.idle:.0f} s (per second) | {idle['web_ms']:22.2f} | {idle['pg_ms']:22.2f} | {idle['worker_ms']:14.2f} "
        f"| {idle['statements']:10.2f} | {'':>7} | {'':>7} | {'':>8} |"
    )
    print(f"idle statements per second by process: {by_app}")
    print(
        "web CPU: the web process tree; PG CPU: the backends the web process holds; worker CPU: the worker "
        "and its backends until idle again, less its idle rate (the jobs the operation implies); statements: the "
        "web's, from the server's log; per core: requests per CPU-second of web + PG; [min-max] over the rounds."
    )
    append = results.get("append one message")
    build = results.get("context build (recall, profile, manifest)")
    if append is None or build is None:
        return
    turn = statistics.median(
        [w.web_ms + w.pg_ms + w.worker_ms for w in append.windows]
    ) * 2 + statistics.median([w.web_ms + w.pg_ms + w.worker_ms for w in build.windows])
    print(
        f"sizing: a turn (the user's message and the answer appended, with their jobs, and one build) costs "
        f"{turn:.1f} ms of CPU: one core serves ~{10_000 / turn:.0f} agents at one turn every 10 s"
    )


def profile(stack: Stack, op: Op, seconds: float, data: Path) -> None:
    """py-spy (`pip install py-spy`) on the web process while `op` runs in a loop: where its time goes."""
    folded = data / f"profile-{op.key}.txt"
    spy = subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(stack.pids["web"]), "--format", "raw",
         "--output", str(folded), "--duration", str(int(seconds)), "--rate", "250", "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)
    done = 0
    while spy.poll() is None:
        op.run(done)
        done += 1
    total: Counter[str] = Counter()
    own: Counter[str] = Counter()
    samples = 0
    for line in folded.read_text().splitlines():
        stack_text, _, count = line.rpartition(" ")
        frames = [frame for frame in stack_text.split(";") if frame]
        if not frames or not count.isdigit():
            continue
        samples += int(count)
        for frame in set(frames):
            total[frame] += int(count)
        own[frames[-1]] += int(count)
    print(
        f"\n{op.name}: {done} requests, {samples} samples of busy threads (py-spy leaves idle ones out) ({folded})"
    )
    print("inclusive:")
    for frame, hits in total.most_common(60):
        print(f"  {100 * hits / max(1, samples):5.1f} %  {frame}")
    print("self:")
    for frame, hits in own.most_common(25):
        print(f"  {100 * hits / max(1, samples):5.1f} %  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ops", type=int, default=30, help="requests per window (builds: half)")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle measure")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument(
        "--only", default="", help="these operations only: floor,insert,tenant,append,search,repeat,build"
    )
    parser.add_argument(
        "--profile", default="", help="py-spy the web process while this operation runs, instead"
    )
    parser.add_argument("--profile-seconds", type=float, default=20.0)
    parser.add_argument(
        "--statements",
        action="store_true",
        help="print the web's statements of one request of each operation, instead",
    )
    parser.add_argument("--width", type=int, default=160, help="--statements: characters of each shown")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
