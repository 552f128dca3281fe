"""The worker heartbeat's deadline, and the liveness probe docs/production.md gives for it."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import pytest
from django.core.cache import cache

from memory.services.job_health import HEARTBEAT_KEY, heartbeat_record, jobs_health

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[3]


def _documented_probe() -> str:
    """The Python the production liveness probe runs (`ctxapp manage shell -c "<this>"`)."""
    found = re.search(r'"shell", "-c",\s*\n\s*"([^"]+)"', (REPO / "docs" / "production.md").read_text())
    assert found, "docs/production.md has no liveness probe command"
    return found[1]


def _probe_exit_code() -> int:
    with pytest.raises(SystemExit) as exited:
        exec(_documented_probe(), {})  # what `manage shell -c` runs
    return int(exited.value.code or 0)


def test_the_probe_fails_once_the_heartbeat_is_older_than_the_deadline(settings):
    cache.delete(HEARTBEAT_KEY)
    assert _probe_exit_code() == 0  # no heartbeat yet: a worker that has not started is not wedged
    cache.set(HEARTBEAT_KEY, time.time() - 61, timeout=None)
    health = jobs_health()
    assert health["stalled"] and health["error"].startswith("no worker ran the heartbeat job for 6")
    assert _probe_exit_code() == 1
    heartbeat_record()
    assert not jobs_health()["stalled"] and _probe_exit_code() == 0


def test_the_deadline_is_the_setting(settings):
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, job_heartbeat_deadline_seconds=5.0)
    cache.set(HEARTBEAT_KEY, time.time() - 8, timeout=None)
    health = jobs_health()
    assert health["deadline_s"] == 5.0 and health["stalled"]
