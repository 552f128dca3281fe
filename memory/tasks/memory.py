"""Celery tasks of the memory index (memory/services/message_indexing.py). Thin: one service call."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from memory.services.embedding import EmbedderUnavailable
from memory.services.message_indexing import DRAIN_TASK_NAME, memory_index_drain, memory_index_sweep

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 600.0


@shared_task(bind=True, acks_late=True, max_retries=None, name=DRAIN_TASK_NAME)
def memory_index_drain_task(self) -> int:
    """Embed pending messages in batches. A transient embedder error retries with exponential
    backoff (the rows count the attempt and fail for good after CTXAPP_EMBEDDING_MAX_RETRIES)."""
    try:
        return memory_index_drain().completed
    except EmbedderUnavailable as exc:
        backoff = settings.CTXAPP.embedding_retry_backoff
        countdown = min(MAX_BACKOFF_SECONDS, backoff * 2 ** min(self.request.retries, 20))
        logger.info("memory index drain retry %d in %.1fs: %s", self.request.retries + 1, countdown, exc)
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(acks_late=True, name="memory.index.sweep")
def memory_index_sweep_task() -> int:
    """Re-dispatch the drain when messages have waited too long (a lost dispatch or job)."""
    return memory_index_sweep()


SCHEDULE: dict = {
    "memory-index-sweep": {"task": "memory.index.sweep", "schedule": 60.0},
}
