"""Celery tasks of the sessions capability: retention (Celery beat, every few minutes).

Thin: each task calls one service of memory/services/retention.py. They are idempotent and safe
to overlap (rows are claimed with SKIP LOCKED), so a late or duplicated beat tick is harmless.
"""

from __future__ import annotations

import dataclasses

from celery import shared_task
from celery.schedules import crontab
from django.db import OperationalError

from memory.services import retention


@shared_task(acks_late=True, autoretry_for=(OperationalError,), retry_backoff=10, max_retries=3)
def sessions_retention_run() -> dict[str, int]:
    """Expire idle sessions, evict over-limit ones, purge old tasks, events and idempotency records."""
    return dataclasses.asdict(retention.retention_run())  # the task's result, for the worker's log


SCHEDULE: dict = {
    "sessions-retention": {
        "task": "memory.tasks.sessions.sessions_retention_run",
        "schedule": crontab(minute="*/5"),
    },
}
