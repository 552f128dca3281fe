"""Celery tasks of experience memory: embed, distil, evict, sweep. Thin: ids in, one service call.

All run with acks_late (settings: CELERY_TASK_ACKS_LATE, REJECT_ON_WORKER_LOST): a worker that
dies mid-job leaves its message unacknowledged and the broker delivers it again. Every job is
idempotent, so a second delivery does no second write.
"""

from __future__ import annotations

from celery import shared_task
from celery.schedules import crontab
from django.db import transaction

from memory.models import Task
from memory.services.distillation import task_distill_full
from memory.services.experiences import experiences_evict_all, experiences_requeue_stale
from memory.services.experiences.queue import embedding_enqueue


@shared_task(acks_late=True, name="memory.experiences.embed")
def experiences_embed_task(experience_ids: list[int]) -> int:
    """Embed a batch queued as a plain Celery message (by an older release): handed to the jobs
    outbox like every embedding, whose embedding kind retries transient errors with backoff
    (CTXAPP_EMBEDDING_MAX_RETRIES, CTXAPP_EMBEDDING_RETRY_BACKOFF) and then, or on a permanent
    error, marks the rows `failed`. Returns how many ids were handed on."""
    with transaction.atomic():
        embedding_enqueue(experience_ids)
    return len(experience_ids)


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
