"""Process supervision for `ctxapp up`: the data-directory lock, spawning and stopping the
children, the records that let the next `up` find what a killed one left behind, and waiting
for /readyz."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fasteners
import psutil

from ctxapp.cli.base import CliError, Interrupted
from ctxapp.cli.ctx import SERVER_FILE
from ctxapp.infra.processes import die_with_parent

STOP_TIMEOUT_SECONDS = 20.0
# The pids `ctxapp up` started (and the embedded postmaster's), so the next `up` can find what a
# killed run left behind. Removed on a clean stop.
UP_FILE = "up.json"


def lock_data_dir(data_dir: Path) -> Any:
    """Hold an exclusive lock on the data directory for the life of `ctxapp up`.

    An OS file lock dies with its process, so a crashed run never leaves a stale lock behind;
    the pid file is only there to name the holder in the message.
    """
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"Cannot create the data directory {data_dir}: {exc.strerror}.") from None
    if not os.access(data_dir, os.W_OK):
        raise CliError(f"The data directory {data_dir} is not writable by this user.")
    lock = fasteners.InterProcessLock(str(data_dir / "up.lock"))
    if not lock.acquire(blocking=False):
        pid_file = data_dir / "up.pid"
        holder = pid_file.read_text().strip() if pid_file.exists() else "unknown"
        raise CliError(
            f"Another `ctxapp up` (pid {holder}) is already using the data directory {data_dir}. "
            "Stop it first (Ctrl-C in its terminal), or give this one its own directory: "
            "CTXAPP_DATA_DIR=/some/other/dir ctxapp up"
        )
    (data_dir / "up.pid").write_text(str(os.getpid()))
    return lock


def spawn(argv: list[str], env: dict[str, str], name: str = "") -> subprocess.Popen[bytes]:
    # Each child leads its own session and process group: a Ctrl-C in the terminal reaches only
    # us, and we stop each child together with its own children (Celery's pool, uvicorn's workers).
    # Each child also gets SIGTERM if we die without stopping it (SIGKILL, OOM killer).
    if name and "PGAPPNAME" not in env:
        # libpq's application_name: pg_stat_activity and the server's log tell the processes apart.
        env = {**env, "PGAPPNAME": f"ctxapp-{name}"}
    return subprocess.Popen(
        argv,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent(os.getpid()),
    )


def process_record(pid: int) -> dict[str, Any] | None:
    try:
        proc = psutil.Process(pid)
        return {"pid": pid, "create_time": proc.create_time(), "cmdline": proc.cmdline()}
    except psutil.Error:
        return None


def up_file_write(data_dir: Path, children: dict[str, subprocess.Popen[bytes]]) -> None:
    from ctxapp.infra.embedded import pgdata_dir  # lazy: startup-cost

    records = {name: process_record(proc.pid) for name, proc in children.items()}
    with contextlib.suppress(OSError, ValueError, IndexError):
        postmaster = int((pgdata_dir(data_dir) / "postmaster.pid").read_text().split()[0])
        records["postgres"] = process_record(postmaster)
    with contextlib.suppress(OSError):
        (data_dir / UP_FILE).write_text(
            json.dumps({"pid": os.getpid(), "processes": {k: v for k, v in records.items() if v}})
        )


def stop_leftovers(data_dir: Path, timeout: float = STOP_TIMEOUT_SECONDS) -> list[str]:
    """Stop the web server, worker and beat an earlier `up` on this data directory left running.

    Called with the data-directory lock held, so their `up` is gone: they are orphans (a killed
    `up` on a system without PR_SET_PDEATHSIG, or one killed between spawn and prctl). A process
    counts only if its pid, start time and command line all match the record, so a reused pid is
    never signalled. Each is sent SIGTERM, waited for, then its process group is SIGKILLed.
    The embedded PostgreSQL is not stopped: the next start attaches to it (pgserver reuses a live
    postmaster on its data directory). Returns "name (pid N)" for each process stopped.
    """
    path = data_dir / UP_FILE
    try:
        recorded = dict(json.loads(path.read_text()).get("processes", {}))
    except (OSError, ValueError, AttributeError):
        return []
    found: list[tuple[str, psutil.Process]] = []
    for name, record in recorded.items():
        if name == "postgres" or not isinstance(record, dict):
            continue
        try:
            proc = psutil.Process(int(record["pid"]))
            same = proc.create_time() == record.get("create_time") and proc.cmdline() == record.get("cmdline")
        except (psutil.Error, KeyError, TypeError, ValueError):
            continue
        if same and proc.status() != psutil.STATUS_ZOMBIE:
            found.append((name, proc))
    for _, proc in found:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs([proc for _, proc in found], timeout=timeout)
    for proc in [p for _, p in found]:  # SIGKILL the stragglers and whatever their groups hold
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=5)
    with contextlib.suppress(OSError):
        path.unlink()
    return [f"{name} (pid {proc.pid})" for name, proc in found]


def stop_children(
    children: dict[str, subprocess.Popen[bytes]], timeout: float = STOP_TIMEOUT_SECONDS
) -> None:
    # SIGTERM to each leader only: Celery and uvicorn stop their own pools and workers in order
    # (a signal to the whole group would kill pool processes under a running task).
    for proc in children.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for name, proc in children.items():
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"ctxapp: the {name} process did not stop within {timeout:.0f} s; killing it.", flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    for proc in children.values():  # anything a child left behind in its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


# A child that dies is started again after a pause that doubles with each quick death (capped),
# so a crash loop costs little and logs one line per attempt; a child that stayed up for
# STABLE_SECONDS starts again from the first pause.
RESTART_BACKOFF_SECONDS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
STABLE_SECONDS = 60.0


@dataclasses.dataclass
class Restarts:
    """What `up` needs to start a dead child again, and when it may."""

    argvs: dict[str, list[str]]
    env: dict[str, str]
    started: dict[str, float] = dataclasses.field(default_factory=dict)
    failures: dict[str, int] = dataclasses.field(default_factory=dict)
    due: dict[str, float] = dataclasses.field(default_factory=dict)

    def note_started(self, name: str) -> None:
        self.started[name] = time.monotonic()

    def schedule(self, name: str, code: int | None) -> None:
        """Note that `name` died with `code`; it is started again by `restart_due`."""
        if name in self.due:
            return
        now = time.monotonic()
        if now - self.started.get(name, now) >= STABLE_SECONDS:
            self.failures[name] = 0
        failures = self.failures.get(name, 0)
        pause = RESTART_BACKOFF_SECONDS[min(failures, len(RESTART_BACKOFF_SECONDS) - 1)]
        self.failures[name] = failures + 1
        self.due[name] = now + pause
        print(
            f"ctxapp: the {name} process exited (code {code}); starting it again in {pause:.0f} s.",
            flush=True,
        )

    def restart_due(self, children: dict[str, subprocess.Popen[bytes]]) -> list[str]:
        now = time.monotonic()
        restarted = [name for name, when in self.due.items() if when <= now]
        for name in restarted:
            del self.due[name]
            old = children[name]
            with contextlib.suppress(ProcessLookupError, PermissionError):  # its pool, uvicorn workers
                os.killpg(old.pid, signal.SIGKILL)
            children[name] = spawn(self.argvs[name], self.env, name)
            self.note_started(name)
            print(f"ctxapp: started the {name} process again (pid {children[name].pid}).", flush=True)
        return restarted


def stop_child(name: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Stop one child (SIGTERM, then SIGKILL of its group after `timeout`), e.g. a wedged worker."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        print(f"ctxapp: the {name} process did not stop within {timeout:.0f} s; killing it.", flush=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def local_url(host: str, port: int) -> str:
    reachable = "127.0.0.1" if host in {"0.0.0.0", "::", ""} else host
    if ":" in reachable:
        reachable = f"[{reachable}]"
    return f"http://{reachable}:{port}"


def wait_ready(
    url: str, children: dict[str, subprocess.Popen[bytes]], stop_requested: Callable[[], bool], timeout: float
) -> dict[str, Any]:
    """Poll /readyz until every dependency is ok; fail early if a child dies or we are stopped."""
    deadline = time.monotonic() + timeout
    last: Any = "no answer"
    while time.monotonic() < deadline:
        if stop_requested():
            raise Interrupted()
        for name, proc in children.items():
            if proc.poll() is not None:
                raise CliError(
                    f"The {name} process exited with code {proc.returncode} during start-up; "
                    "its messages are above."
                )
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                answer = dict(json.loads(response.read()))
            if answer.get("status") == "ok" or _ready_but_jobs(answer):
                return answer
            last = answer.get("checks", answer)  # degraded: the broker is not ready yet
        except urllib.error.HTTPError as exc:  # 503: a dependency is not ready yet
            with contextlib.suppress(ValueError):
                last = json.loads(exc.read()).get("checks", exc)
        except (OSError, ValueError) as exc:  # not listening yet
            last = exc
        time.sleep(0.3)
    raise CliError(f"ctxapp did not become ready within {timeout:.0f} s (last /readyz answer: {last}).")


def _ready_but_jobs(answer: dict[str, Any]) -> bool:
    """Every dependency is ok and only the job queue lags: the worker is up, so `up` is ready
    (a queue left by an earlier run is worked off after start-up)."""
    checks = answer.get("checks", {})
    return bool(checks) and all(part.get("ok") for name, part in checks.items() if name != "jobs")


def server_file_write(data_dir: Path, url: str) -> None:
    """Tell `ctxapp demo` / `ctxapp ctx` / `ctxapp mcp` on this machine where the server runs."""
    with contextlib.suppress(OSError):
        (data_dir / SERVER_FILE).write_text(json.dumps({"url": url, "pid": os.getpid()}))


def server_file_remove(data_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (data_dir / SERVER_FILE).unlink()


def stop_embedded() -> None:
    """Stop the embedded PostgreSQL this process started, and the one now running on its data
    directory if it is another: an operator may have restarted the server under a running `up`
    (pgserver only stops the postmaster it started itself, so a restarted one would keep running
    after "stopped.")."""
    # pgserver stops the server from an atexit hook once its last user is gone; doing it here
    # lets "stopped." be the truth when it is printed.
    with contextlib.suppress(Exception):
        from ctxapp.infra import embedded, pgserver_adapter  # lazy: startup-cost

        for server in embedded.started_servers():
            started = pgserver_adapter.postmaster_pid(server)
            server.cleanup()
            embedded.forget_server(server)
            pgserver_adapter.stop_replacement_postmaster(server, started)
