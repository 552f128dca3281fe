"""What the test run needs beyond Python packages, found before any test runs.

The browser tests drive Debian's Chromium (Playwright cannot download its own browser here).
When the selected tests need Chromium and it is missing, the run calls scripts/test-setup if it
runs as root with apt-get, and otherwise stops before the first test with the command to run:
one clear message instead of an error per test. (The engines, PostgreSQL and Redis, come from
Python wheels: ctxapp/settings_test.py starts them.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "test-setup"
DEFAULT_CHROMIUM = "/usr/bin/chromium"


def chromium_path() -> str | None:
    """The Chromium executable: $CTXAPP_CHROMIUM, /usr/bin/chromium, or `chromium` on PATH."""
    for candidate in (os.environ.get("CTXAPP_CHROMIUM"), DEFAULT_CHROMIUM):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def chromium_ensure(*, install: bool | None = None) -> str:
    """Chromium's path, installing it with scripts/test-setup when allowed (root with apt-get).

    Raises pytest.UsageError naming the command to run when it is missing and cannot be
    installed here, or when the installation failed."""
    path = chromium_path()
    if path is not None:
        return path
    if install if install is not None else _can_install():
        done = subprocess.run([str(SETUP)], check=False)
        path = chromium_path()
        if path is not None:
            return path
        failure = f"scripts/test-setup exited with {done.returncode} and Chromium is still missing."
    else:
        failure = "Chromium is not installed and this run cannot install it (it needs root and apt-get)."
    raise pytest.UsageError(
        f"The browser tests (marker `browser`) need Chromium. {failure}\n"
        f"  Set it up with:  sudo {SETUP.relative_to(REPO)}\n"
        "  (or: sudo apt-get install chromium fonts-dejavu-core; or point CTXAPP_CHROMIUM at a\n"
        "  Chromium), or leave those tests out with:  -m 'not browser'"
    )


def require_for(items: Sequence[pytest.Item]) -> None:
    """Before the run: make sure what the selected tests need is here (pytest hook helper)."""
    if any(item.get_closest_marker("browser") for item in items):
        os.environ["CTXAPP_CHROMIUM"] = chromium_ensure()
