"""Celery tasks of the job outbox (memory/services/jobs.py). Thin: an intent id in, one service call."""

from __future__ import annotations

from celery import shared_task
from celery.schedules import crontab
from django.conf import settings

from memory.services import jobs


@shared_task(acks_late=True, name="memory.jobs.run")
def job_run_task(intent_id: int) -> str:
    """Run one job intent. Idempotent: a second delivery finds it done or held, and does nothing."""
    return jobs.job_run(intent_id=intent_id)


@shared_task(acks_late=True, name="memory.jobs.sweep")
def jobs_sweep_task() -> int:
    """Dispatch again the intents a lost message or a dead worker left behind. Safe to overlap."""
    return jobs.jobs_sweep()


@shared_task(acks_late=True, name="memory.jobs.purge")
def jobs_purge_task() -> int:
    """Delete finished intents older than CTXAPP_JOB_KEEP_DAYS."""
    return jobs.jobs_purge()


SCHEDULE: dict = {
    "jobs-sweep": {
        "task": "memory.jobs.sweep",
        "schedule": settings.CTXAPP.job_sweep_seconds,
    },
    "jobs-purge": {"task": "memory.jobs.purge", "schedule": crontab(minute=17)},
}
