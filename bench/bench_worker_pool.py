"""Which Celery pool for the worker: jobs per second, and what a killed pool process costs.

    .venv/bin/python bench/bench_worker_pool.py [--pools prefork,threads,solo] [--writes 30]

For each pool, a real `ctxapp up` (embedded mode) on a fresh data directory with
CTXAPP_WORKER_POOL=<pool>: `--writes` experiences are written one by one (each implies an
embedding job) and the drill measures the time until every one is embedded. Then every pool
process of the worker is SIGKILLed between tasks (prefork has two; threads and solo run their
tasks in the worker's main process, so there is none to kill), a new experience is written, and
the drill measures the time until it is embedded: whether the worker went on by itself, or
wedged until `up` restarted it after the heartbeat deadline.

Prints one line per pool. Each pool takes about a minute (longer when the pool wedges).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fault_drills import BANNER, all_embedded, api_key, write
from tests.test_cli_up import READY_TIMEOUT, free_port, newcomer_env, start_up, stop


def _worker(up_pid: int) -> psutil.Process:
    [worker] = [p for p in psutil.Process(up_pid).children() if "worker" in p.cmdline()]
    return worker


def run(pool: str, writes: int, heartbeat_deadline: float) -> str:
    work = Path(tempfile.mkdtemp(prefix=f"ctxapp-pool-{pool}-"))
    data_dir, port = work / "data", free_port()
    env = {
        **newcomer_env(data_dir, port),
        "CTXAPP_WORKER_POOL": pool,
        "CTXAPP_JOB_HEARTBEAT_DEADLINE_SECONDS": str(heartbeat_deadline),
    }
    up = start_up(env, work)
    try:
        up.wait_for(BANNER, READY_TIMEOUT)
        headers = {"Authorization": f"Bearer {api_key(up.output())}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30) as client:
            started = time.monotonic()
            ids = [write(client, i).json()["id"] for i in range(writes)]
            embedded = all_embedded(client, ids, timeout=300)
            took = time.monotonic() - started
            children = _worker(up.proc.pid).children()
            for process in children:
                process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            after = write(client, writes).json()["id"]
            all_embedded(client, [after], timeout=heartbeat_deadline + 120)
            back = time.monotonic() - killed
        restarted = "the worker runs no jobs" in up.output()
        return (
            f"{pool:8} {writes} embeddings in {took:.1f} s ({writes / took:.2f}/s, last {embedded:.1f} s "
            f"after the writes); {len(children)} pool processes SIGKILLed: the next job ran after "
            f"{back:.1f} s ({'wedged: up restarted the worker' if restarted else 'no restart needed'})"
        )
    finally:
        stop(up)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", default="prefork,threads,solo")
    parser.add_argument("--writes", type=int, default=30)
    parser.add_argument("--heartbeat-deadline", type=float, default=20.0)
    args = parser.parse_args()
    for pool in args.pools.split(","):
        print(run(pool, args.writes, args.heartbeat_deadline), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
