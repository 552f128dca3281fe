"""Celery tasks of the context engine (thin: ids in, one service call)."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from memory.models import Session
from memory.services import rolling_summary
from memory.services import session_digest as digest

SCHEDULE: dict = {}


@shared_task(acks_late=True, autoretry_for=(OperationalError,), retry_backoff=5, max_retries=5)
def session_summarise(session_id: int) -> None:
    """Fold a session's old messages into its rolling summary, then update its digest. Idempotent;
    a deleted session is skipped."""
    session = Session.objects.select_related("tenant", "agent").filter(pk=session_id).first()
    if session is None:
        return
    rolling_summary.session_summarise(tenant=session.tenant, session=session)
    digest.session_digest_update(tenant=session.tenant, session=session)


@shared_task(acks_late=True, autoretry_for=(OperationalError,), retry_backoff=5, max_retries=5)
def session_digest(session_id: int) -> None:
    """Bring a session's digest (medium-term memory) up to date. Idempotent; a deleted session is skipped."""
    session = Session.objects.select_related("tenant").filter(pk=session_id).first()
    if session is None:
        return
    digest.session_digest_update(tenant=session.tenant, session=session)
