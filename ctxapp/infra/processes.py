"""Child processes that do not outlive the process that started them."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> Any:
    """A `preexec_fn` that makes the child get SIGTERM when `parent_pid` dies, even by SIGKILL.

    Linux only (prctl PR_SET_PDEATHSIG); elsewhere `ctxapp up` finds leftovers through its
    records of them (ctxapp/cli/supervise.py). If the parent died before prctl took effect, stop
    at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
