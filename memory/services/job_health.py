"""Is any worker running jobs? A heartbeat job with a deadline, and the age of the job queue.

Celery beat sends `memory.jobs.heartbeat` every HEARTBEAT_SECONDS; the worker that runs it
stamps the time in the shared cache (Redis), so every process reads the same answer and the
jobs list stays free of heartbeats. A worker whose pool is wedged still answers Celery's ping
from its main process, but runs no task: its heartbeat stops. /readyz reports the heartbeat's age
with the oldest waiting job and the last finished one; `ctxapp up` reads the heartbeat from the
cache itself (no request, no SQL) and restarts the worker when it is older than
CTXAPP_JOB_HEARTBEAT_DEADLINE_SECONDS, and docs/production.md gives the same test as a liveness
probe.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max, Min
from django.utils import timezone

from memory.models import JobIntent, JobStatus

HEARTBEAT_KEY = "ctxapp:worker-heartbeat"
HEARTBEAT_SECONDS = 10.0


def heartbeat_deadline_seconds() -> float:
    """CTXAPP_JOB_HEARTBEAT_DEADLINE_SECONDS (60 s): several missed beats, so a worker busy with a
    long job on every pool process is not called wedged."""
    return float(settings.CTXAPP.job_heartbeat_deadline_seconds)


def heartbeat_record() -> None:
    """Stamp the heartbeat row: a worker ran a task now."""
    cache.set(HEARTBEAT_KEY, timezone.now().timestamp(), timeout=None)


def heartbeat_last() -> datetime | None:
    stamp = cache.get(HEARTBEAT_KEY)
    return datetime.fromtimestamp(float(stamp), UTC) if stamp is not None else None


def heartbeat_stalled(now: datetime | None = None) -> tuple[bool, float | None]:
    """(stalled, the heartbeat's age in seconds): stalled when it is older than the deadline. No
    heartbeat yet (a worker never ran one) is not stalled. One read of the shared cache, no SQL:
    `ctxapp up` asks it every few seconds."""
    age = _age(heartbeat_last(), now or timezone.now())
    return age is not None and age > heartbeat_deadline_seconds(), age


def _age(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else round((now - moment).total_seconds(), 1)


def jobs_health() -> dict[str, Any]:
    """The queue's age, the last finished job and the heartbeat's age; `stalled` when the
    heartbeat is overdue. Read-only; no heartbeat yet (a worker never ran one) is not stalled."""
    now = timezone.now()
    open_ = JobIntent.objects.filter(status=JobStatus.PENDING).exclude(run_after__gt=now)
    oldest = open_.aggregate(oldest=Min("created_at"))["oldest"]
    last = JobIntent.objects.filter(status__in=[JobStatus.DONE, JobStatus.FAILED]).aggregate(
        last=Max("finished_at")
    )["last"]
    stalled, heartbeat_age = heartbeat_stalled(now)
    deadline = heartbeat_deadline_seconds()
    report: dict[str, Any] = {
        "ok": not stalled,
        "oldest_queued_age_s": _age(oldest, now),
        "last_finished_at": last.isoformat() if last else None,
        "heartbeat_age_s": heartbeat_age,
        "deadline_s": deadline,
        "stalled": stalled,
    }
    if stalled:
        report["error"] = f"no worker ran the heartbeat job for {heartbeat_age:.0f} s"
    return report
