"""Celery tasks of experience memory: embed, distil, evict, sweep. Thin: ids in, one service call.

All run with acks_late (settings: CELERY_TASK_ACKS_LATE, REJECT_ON_WORKER_LOST): a worker that
dies mid-job leaves its message unacknowledged and the broker delivers it again. Every job is
idempotent, so a second delivery does no second write.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.schedules import crontab
from django.conf import settings

from memory.models import Task
from memory.services.distillation import task_distill_full
from memory.services.embedding import EmbedderError, EmbedderUnavailable
from memory.services.experiences import (
    experiences_embed,
    experiences_evict_all,
    experiences_mark_failed,
    experiences_requeue_stale,
)

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 600.0


@shared_task(bind=True, acks_late=True, max_retries=None, name="memory.experiences.embed")
def experiences_embed_task(self, experience_ids: list[int]) -> int:
    """Embed one batch. Transient errors retry with exponential backoff (CTXAPP_EMBEDDING_MAX_RETRIES,
    CTXAPP_EMBEDDING_RETRY_BACKOFF); then, or on a permanent error, the rows become `failed`."""
    try:
        return experiences_embed(experience_ids=experience_ids)
    except EmbedderUnavailable as exc:
        max_retries = settings.CTXAPP.embedding_max_retries
        if self.request.retries >= max_retries:
            experiences_mark_failed(
                experience_ids=experience_ids,
                reason=f"gave up after {self.request.retries + 1} attempts: {exc}",
            )
            return 0
        backoff = settings.CTXAPP.embedding_retry_backoff
        countdown = min(MAX_BACKOFF_SECONDS, backoff * 2**self.request.retries)
        logger.info("embedding batch retry %d in %.1fs: %s", self.request.retries + 1, countdown, exc)
        raise self.retry(exc=exc, countdown=countdown, max_retries=max_retries) from exc
    except EmbedderError as exc:
        experiences_mark_failed(experience_ids=experience_ids, reason=f"{type(exc).__name__}: {exc}")
        return 0


@shared_task(acks_late=True, name="memory.experiences.distill")
def task_distill_task(task_pk: int) -> int:
    """Full distillation of one finished task (see memory.services.distillation)."""
    task = Task.objects.filter(pk=task_pk).select_related("tenant", "session", "agent").first()
    if task is None:  # purged meanwhile: nothing to learn from
        return 0
    return len(task_distill_full(tenant=task.tenant, task=task))


@shared_task(acks_late=True, name="memory.experiences.evict")
def experiences_evict_task() -> int:
    """Capacity: evict least recently used experiences of every tenant over its policy's capacity."""
    return experiences_evict_all()


@shared_task(acks_late=True, name="memory.experiences.requeue_stale")
def experiences_requeue_stale_task() -> int:
    """Re-queue embedding of experiences pending for too long (a job lost before it was queued)."""
    return experiences_requeue_stale()


SCHEDULE: dict = {
    "experiences-evict": {"task": "memory.experiences.evict", "schedule": crontab(minute="*/10")},
    "experiences-requeue-stale": {
        "task": "memory.experiences.requeue_stale",
        "schedule": crontab(minute="*/5"),
    },
}
