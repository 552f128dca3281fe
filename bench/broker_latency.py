"""Broker latency of a trivial Celery task: enqueue → the worker starts running it.

    python bench/broker_latency.py [--samples 30]

Measures both run modes on this machine: Redis (REDIS_URL, default redis://127.0.0.1:6379/0) and
the Redis-less mode (Kombu's SQLAlchemy transport on the embedded PostgreSQL). Starts its own
embedded PostgreSQL in a temporary directory and a real Celery worker per mode; sends one task at
a time and waits for it, so each sample is one uncontended round trip. Prints median, p90, max.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TASK_NAME = "bench.broker_echo"

if __name__ != "__main__":  # imported by the worker (--include broker_latency): define the task
    from celery import shared_task

    @shared_task(name=TASK_NAME)
    def broker_echo(sent_at: float, out: str) -> None:
        with open(out, "a") as handle:
            handle.write(f"{time.time() - sent_at}\n")


def measure(env: dict[str, str], samples: int) -> list[float]:
    queue = f"{env['CTXAPP_QUEUE_PREFIX']}-default"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ctxapp", "--quiet", "worker", "--loglevel", "warning",
         "--concurrency", "1", "--pool", "solo", "--queues", queue, "--include", "broker_latency",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        env={**env, "PYTHONPATH": f"{BENCH_DIR}{os.pathsep}{REPO}"},
    )  # fmt: skip
    out = Path(tempfile.mkstemp(prefix="broker-latency-")[1])
    try:
        # The sender stamps time.time() into each task when sending it, so its own start-up
        # is not part of the figure.
        sender = subprocess.Popen(
            [sys.executable, "-c", _sender_loop(queue, str(out), samples)],
            env={**env, "PYTHONPATH": str(REPO)},
        )
        sender.wait(600)
        values = [float(line) for line in out.read_text().split()]
    finally:
        worker.terminate()
        worker.wait(30)
        out.unlink(missing_ok=True)
    return values[1:]  # the first one includes the worker's start-up


def _sender_loop(queue: str, out: str, samples: int) -> str:
    return f"""
import time
from pathlib import Path
import django
django.setup()
from ctxapp.celery import app
out = Path({out!r})
for i in range({samples} + 1):
    before = len(out.read_text().split()) if out.exists() else 0
    app.send_task({TASK_NAME!r}, args=[time.time(), {out!r}], queue={queue!r})
    deadline = time.time() + 60
    while (len(out.read_text().split()) if out.exists() else 0) <= before:
        if time.time() > deadline:
            raise SystemExit("the worker did not run the task within 60 s")
        time.sleep(0.002)
"""


def report(name: str, values: list[float]) -> None:
    ms = sorted(v * 1000 for v in values)
    p90 = ms[int(len(ms) * 0.9) - 1]
    print(
        f"{name:<44} n={len(ms):<3} median {statistics.median(ms):7.1f} ms"
        f"   p90 {p90:7.1f} ms   max {ms[-1]:7.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from ctxapp.infra import embedded

    data = Path(tempfile.mkdtemp(prefix="broker-latency-"))
    server = embedded.start_server(data / "pg", cleanup_mode="delete")
    db_url = embedded.prepare_database(server.get_uri(), "ctxapp")
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CTXAPP_") and k not in {"REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"}
    }
    base.update(
        {
            "DJANGO_SETTINGS_MODULE": "ctxapp.settings",
            "DATABASE_URL": db_url,
            "CTXAPP_DATA_DIR": str(data),
            "CTXAPP_SECRET_KEY": "bench",
            "CTXAPP_QUEUE_PREFIX": f"bench{uuid.uuid4().hex[:6]}",
        }
    )
    print(f"{args.samples} sequential tasks per mode (enqueue -> worker starts the task)")
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    report(f"Redis ({redis_url})", measure({**base, "REDIS_URL": redis_url}, args.samples))
    report("PostgreSQL (Kombu SQLAlchemy transport)", measure(base, args.samples))


if __name__ == "__main__":
    main()
