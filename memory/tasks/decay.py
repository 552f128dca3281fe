"""Celery tasks of the decay capability (thin: ids in, one service call)."""

from __future__ import annotations

from celery import shared_task

from memory.models import Session
from memory.services import decay

SCHEDULE: dict = {
    "decay-embed-missing-facts": {"task": "memory.tasks.decay.facts_embed_missing", "schedule": 600.0},
}


@shared_task(acks_late=True)
def session_facts_promote(session_id: int) -> list[str]:
    """Promote a session's high-importance facts, preferences and project configuration. Idempotent."""
    session = Session.objects.filter(pk=session_id).select_related("tenant", "agent").first()
    if session is None:  # deleted meanwhile: nothing to do
        return []
    return decay.facts_promote(tenant=session.tenant, session=session).promoted


@shared_task(acks_late=True)
def facts_embed_missing(limit: int = 500) -> int:
    """Embed facts registered while the embedder was unavailable. Idempotent; returns how many."""
    return decay.facts_embed_missing(limit=limit)
