"""Process supervision of `ctxapp up`: a SIGKILLed `up` leaves nothing serving on its data directory.

Proves: the web server, worker and beat exit within a bound once `up` is SIGKILLed (PR_SET_PDEATHSIG);
a new `up` on the same data directory starts cleanly on the same port, reusing the PostgreSQL the
killed run left, and answers /healthz; a concurrent `up` on another port is refused; orphans
recorded in up.json are stopped by the next start, and a reused pid is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from ctxapp.cli import supervise
from tests.test_cli_up import (
    READY_TIMEOUT,
    free_port,
    newcomer_env,
    postmaster_pid,
    run_quick,
    start_up,
)

pytestmark = pytest.mark.cli_up

CHILDREN_EXIT_BOUND = 30.0  # SIGTERM → Celery warm shutdown / uvicorn graceful stop


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def test_a_sigkilled_up_takes_its_children_along_and_the_next_up_starts_cleanly(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    env = newcomer_env(data_dir, port)
    up = start_up(env, tmp_path)
    try:
        up.wait_for("Ctrl-C stops everything.", READY_TIMEOUT)
        children = [p for p in up.tree() if p.pid != up.proc.pid]
        assert len(children) >= 3, [p.cmdline() for p in children]  # web, worker (+ pool), beat
        recorded = json.loads((data_dir / supervise.UP_FILE).read_text())["processes"]
        assert set(recorded) == {"web", "worker", "beat", "redis", "postgres"}
        first_postmaster = postmaster_pid(data_dir)
        killed_at = time.monotonic()
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait(10)
        left = wait_gone(children, CHILDREN_EXIT_BOUND)
        children_gone_s = time.monotonic() - killed_at
        assert not left, [(p.pid, p.cmdline()) for p in left]
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
        print(up.output())

    # The same data directory and the same port: the port is free, PostgreSQL is reused.
    rerun = start_up(env, tmp_path)
    try:
        rerun.wait_for("Ctrl-C stops everything.", READY_TIMEOUT)
        recovered_s = time.monotonic() - killed_at
        print(f"children gone {children_gone_s:.1f} s after SIGKILL; up again after {recovered_s:.1f} s")
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=15)
        assert health.status_code == 200, health.text
        assert postmaster_pid(data_dir) == first_postmaster  # the leftover server was attached to

        # A second `up` while this one lives: refused, even on another port, and nothing started.
        second = run_quick(["up"], newcomer_env(data_dir, free_port()), tmp_path)
        assert second.returncode == 2, second
        assert "Another `ctxapp up`" in second.stderr and str(data_dir) in second.stderr
        assert f"pid {rerun.proc.pid}" in second.stderr
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=15).status_code == 200
        processes = rerun.tree()
    finally:
        code = rerun.interrupt() if rerun.proc.poll() is None else rerun.proc.returncode
        print(rerun.output())
    assert code == 0, rerun.output()
    assert not wait_gone(processes, 10)
    assert postmaster_pid(data_dir) is None  # stopping the rerun stopped the reused PostgreSQL
    assert not (data_dir / supervise.UP_FILE).exists()


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def test_orphans_recorded_by_a_dead_up_are_stopped_and_a_reused_pid_is_spared(tmp_path: Path) -> None:
    orphan, stranger = _sleeper(), _sleeper()
    try:
        record = supervise.process_record(stranger.pid)
        assert record is not None
        reused = {**record, "cmdline": ["celery", "beat"]}  # the pid now runs something else
        processes = {"worker": supervise.process_record(orphan.pid), "beat": reused}
        (tmp_path / supervise.UP_FILE).write_text(json.dumps({"pid": 1, "processes": processes}))

        stopped = supervise.stop_leftovers(tmp_path, timeout=10)

        assert stopped == [f"worker (pid {orphan.pid})"]
        orphan.wait(10)  # already reaped by _stop_leftovers: it is gone when that returns
        assert not psutil.pid_exists(orphan.pid)
        assert stranger.poll() is None  # not ours: left alone
        assert not (tmp_path / supervise.UP_FILE).exists()
    finally:
        for proc in (orphan, stranger):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
