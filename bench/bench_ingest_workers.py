"""Message ingest with the embedding drained: one `ctxapp worker` process against two.

    python bench/bench_ingest_workers.py                       # the figures in docs/benchmarks.md
    python bench/bench_ingest_workers.py --messages 1500 --rounds 3 --workers 1,2

Starts the embedded PostgreSQL in a temporary data directory (schema from the models), one
uvicorn process and the worker processes, each with exactly the command line `ctxapp worker`
runs (ctxapp.cli.processes.worker_argv: CTXAPP_WORKER_POOL, CTXAPP_WORKER_CONCURRENCY), on
Redis. They start once and are warmed one by one; a run with N workers lets the first N consume
the queue and the others not (Celery's add_consumer / cancel_consumer). A run appends `--messages` new messages through REST (batches of 50, 4 clients; real
LoCoMo turns, each made unique so the shared embedding cache never answers) and is timed from
the first append until no message is pending. The runs alternate (1, 2, 2, 1, 1, 2 …) so the
machine's changing load falls on both; medians per worker count are printed with their ratio.

For each run: messages/s, the CPU seconds each component spent (workers, uvicorn, PostgreSQL)
and how many cores were busy on average: a drain that already keeps every core busy with one
worker cannot go faster with two.
"""

# ruff: noqa: E501  (a script that prints tables)
from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import shutil
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
sys.path.insert(0, str(ROOT / "bench"))
from bench_drains import CpuMeter, stop, wait_until  # noqa: E402
from bench_ingest import free_port, prepare, start_server  # noqa: E402
from bench_memory import DATA  # noqa: E402


def fake_remote_embedder(latency: float) -> str:
    """A local OpenAI-compatible /v1/embeddings answering after `latency` seconds (a hosted
    embeddings API's round trip): the drain is then bound by waiting, not by this machine's CPU.
    Returns its URL."""
    import hashlib
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import numpy as np

    def vector(text: str) -> list[float]:
        seed = int(hashlib.sha1(text.encode()).hexdigest()[:8], 16)
        v = np.random.default_rng(seed).standard_normal(384)
        return (v / np.linalg.norm(v)).round(6).tolist()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency)
            data = [{"index": i, "embedding": vector(t)} for i, t in enumerate(body["input"])]
            payload = json.dumps({"data": data, "model": body["model"]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def turns(data: str) -> list[str]:
    from ctxapp.cli.evaluation_data import load

    found: list[str] = []
    for conv in load(data):
        for _, _, items in conv.sessions:
            found.extend(str(t.get("text") or "").strip() for t in items)
    return list(dict.fromkeys(t for t in found if len(t) > 20))


def start_workers(count: int, tag: str, code: Path) -> list[tuple[subprocess.Popen[bytes], str]]:
    """`count` worker processes, each with `ctxapp worker`'s command line and its own node name,
    running the ctxapp of the checkout `code`."""
    from django.conf import settings

    from ctxapp.cli.processes import worker_argv

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ctxapp.settings"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH", "")]))
    started = []
    for i in range(count):
        name = f"ingest-{tag}-{i}@{socket.gethostname()}"
        argv = worker_argv(settings.CTXAPP, name=name)
        started.append((subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True), name))
    from ctxapp.celery import app

    deadline = time.monotonic() + 90
    for proc, name in started:
        while not app.control.ping(destination=[name], timeout=0.5):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"worker {name} did not start")
    return started


async def append_all(base: str, secret: str, texts: list[str], clients: int = 4, batch: int = 50) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {secret}"}
    chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as api:

        async def client(mine: list[list[str]]) -> None:
            session = (await api.post("/api/v1/sessions", json={"agent": "ingest"})).json()["id"]
            for chunk in mine:
                body = {"messages": [{"role": "user", "content": t} for t in chunk]}
                response = await api.post(f"/api/v1/sessions/{session}/messages", json=body)
                assert response.status_code == 201, response.text

        await asyncio.gather(*(client(chunks[i::clients]) for i in range(clients)))


def pending() -> int:
    from django.db import connection

    from memory.models import Message

    connection.close()
    return Message.objects.filter(embedding_status="pending").count()


def consume(workers: list[tuple[subprocess.Popen[bytes], str]], active: int) -> None:
    """Let the first `active` workers take jobs from the queue, the others none (Celery's
    add_consumer / cancel_consumer control commands): the processes stay up and warm."""
    from django.conf import settings

    from ctxapp.celery import app

    queue = f"{settings.QUEUE_PREFIX}-default"
    for i, (_, name) in enumerate(workers):
        if i < active:
            app.control.add_consumer(queue, destination=[name], reply=True, timeout=5)
        else:
            app.control.cancel_consumer(queue, destination=[name], reply=True, timeout=5)


def run(
    base: str, secret: str, workers: list[tuple[subprocess.Popen[bytes], str]], active: int,
    texts: list[str], postmaster: int, server: int,
) -> dict[str, Any]:  # fmt: skip
    consume(workers, active)
    meter = CpuMeter({"uvicorn": server, "postgres": postmaster})
    meters = [CpuMeter({"worker": p.pid}) for p, _ in workers]  # summed over the workers
    for m in (meter, *meters):
        m.start()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    asyncio.run(append_all(base, secret, texts))
    written = time.perf_counter()
    finished = wait_until(lambda: pending() == 0, 600, "the embedding drain")
    cpu = meter.read()
    each = [m.read()["worker"] for m in meters]
    cpu["workers"] = sum(each)
    cpu.pop("client", None)
    took = finished - started
    return {
        "workers": active,
        "messages": len(texts),
        "write_s": written - started,
        "total_s": took,
        "rate": len(texts) / took,
        "cpu": cpu,
        "busy": sum(cpu.values()) / took,
        "cpu_ms": sum(cpu.values()) * 1000 / len(texts),
        "each": each[:active],
        "load": load,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=1500, help="messages appended per run (default 1500)")
    parser.add_argument("--rounds", type=int, default=3, help="runs per worker count (default 3)")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare (default 1,2)")
    parser.add_argument("--data", default=str(DATA), help="a LoCoMo-format file (the texts)")
    parser.add_argument(
        "--worker-code",
        default=str(ROOT),
        help="the checkout whose ctxapp the workers run (default this one; another to compare a change)",
    )
    parser.add_argument(
        "--remote-latency-ms",
        type=float,
        default=0.0,
        help="embed through a local fake OpenAI-compatible endpoint answering after this many ms "
        "(a hosted embeddings API) instead of the local model",
    )
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="ctxapp-bench-"))
    atexit.register(shutil.rmtree, data_dir, True)
    os.environ["CTXAPP_DATA_DIR"] = str(data_dir)
    os.environ.setdefault("CTXAPP_SECRET_KEY", "bench-secret-key")
    os.environ.setdefault("CTXAPP_LOG_LEVEL", "warning")
    os.environ.setdefault("CTXAPP_QUEUE_PREFIX", f"ctxingest{os.getpid()}")
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
    if args.remote_latency_ms:
        os.environ.update(
            {
                "CTXAPP_EMBEDDER": "openai",
                "CTXAPP_EMBEDDING_URL": fake_remote_embedder(args.remote_latency_ms / 1000),
                "CTXAPP_EMBEDDING_MODEL": "bench-remote",
            }
        )
    secret = prepare(data_dir)
    from django.conf import settings

    counts = [int(x) for x in args.workers.split(",")]
    pool = turns(args.data)
    port = free_port()
    server = start_server(port, 1, "ctxapp.settings")
    base = f"http://127.0.0.1:{port}"
    postmaster = int((data_dir / "pg" / "postmaster.pid").read_text().split()[0])
    conf = settings.CTXAPP
    print(
        f"uvicorn (1 process), `ctxapp worker` processes (pool {conf.worker_pool}, concurrency "
        f"{conf.worker_concurrency}), Redis broker, embedded PostgreSQL, {os.cpu_count()} CPUs, "
        f"{f'a fake remote embedder ({args.remote_latency_ms:.0f} ms a call)' if args.remote_latency_ms else 'local MiniLM'}, drain batch {conf.memory_embed_batch}; {args.messages} messages per run; load at start "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        flush=True,
    )
    print(
        f"{'workers':>7} {'msgs':>6} {'write s':>8} {'total s':>8} {'msgs/s':>7} {'busy':>5} {'CPU ms/msg':>10}  CPU s (workers / uvicorn / postgres)  load1"
    )
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    serial = 0
    workers = start_workers(max(counts), "bench", Path(args.worker_code))
    try:
        # Warm-up runs (not counted), one per worker alone: its embedding model loaded, PostgreSQL's
        # caches and uvicorn's first requests.
        for i in range(len(workers)):
            consume(workers[i:] + workers[:i], 1)
            warm = [f"{t} (warm-up {i}-{j})" for j, t in enumerate(pool[:200])]
            run(base, secret, workers[i:] + workers[:i], 1, warm, postmaster, server.pid)
        for r in range(args.rounds):
            order = counts if r % 2 == 0 else list(reversed(counts))
            for n in order:
                serial += 1
                texts = [
                    f"{pool[(serial * args.messages + i) % len(pool)]} (#{serial}-{i})"
                    for i in range(args.messages)
                ]
                res = run(base, secret, workers, n, texts, postmaster, server.pid)
                results[n].append(res)
                cpu = res["cpu"]
                print(
                    f"{n:>7} {res['messages']:>6} {res['write_s']:>8.1f} {res['total_s']:>8.1f} {res['rate']:>7.0f} "
                    f"{res['busy']:>5.2f} {res['cpu_ms']:>10.1f}  {cpu['workers']:.1f} / {cpu['uvicorn']:.1f} / {cpu['postgres']:.1f}"
                    f" (each {' + '.join(f'{x:.1f}' for x in res['each'])}){'':>8} {res['load']:.2f}",
                    flush=True,
                )
        medians = {n: statistics.median(r["rate"] for r in results[n]) for n in counts}
        print("medians: " + ", ".join(f"{n} worker(s) {m:.0f} msgs/s" for n, m in medians.items()))
        if len(counts) == 2:
            print(f"ratio {counts[1]} / {counts[0]} workers: {medians[counts[1]] / medians[counts[0]]:.2f}x")
        busy = {n: statistics.median(r["busy"] for r in results[n]) for n in counts}
        print("median cores busy: " + ", ".join(f"{n} worker(s) {b:.2f}" for n, b in busy.items()))
        per = {n: statistics.median(r["cpu_ms"] for r in results[n]) for n in counts}
        print("median CPU ms per message: " + ", ".join(f"{n} worker(s) {c:.1f}" for n, c in per.items()))
        print(f"load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for proc, _ in workers:
            stop(proc)
        stop(server)
        from django.db import connections

        connections.close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
