"""Retention of sessions, tasks, events and idempotency records (run by Celery beat).

Every function takes an optional `now` so tests can move the clock. Each removal or status
change of a session or task records `retention.evicted` in the same transaction, on the stream
of the agent concerned (the tenant stream when there is none). Safe to run concurrently with
appends and with itself: rows are claimed with `SELECT … FOR UPDATE SKIP LOCKED`, so a session
being appended to right now is left for the next run, and two runs never process one row twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from memory.models import (
    Agent,
    Event,
    IdempotencyRecord,
    OtelSpan,
    Session,
    SessionRetentionPolicy,
    SessionStatus,
    StoreItem,
    Task,
    Tenant,
)
from memory.services import recorder

BATCH = 500


@dataclass
class RetentionReport:
    sessions_expired: int = 0
    sessions_evicted: int = 0
    tasks_purged: int = 0
    events_purged: int = 0
    idempotency_purged: int = 0
    store_items_purged: int = 0


def _session_retire(
    *, tenant: Tenant, sessions: list[Session], status: str, reason: str, now: datetime
) -> None:
    """Set `status` on claimed open sessions and record one `retention.evicted` each (in a transaction)."""
    if not sessions:
        return
    Session.objects.filter(pk__in=[s.pk for s in sessions]).update(
        status=status, ended_at=now, expires_at=None
    )
    for session in sessions:
        session.status = status
        recorder.event_append(
            tenant=tenant,
            type="retention.evicted",
            agent=session.agent,
            session=session,
            payload={
                "kind": "session",
                "id": session.public_id,
                "reason": reason,
                "status": status,
                "last_accessed_at": session.last_accessed_at.isoformat(),
            },
        )


def sessions_expire_idle(*, tenant: Tenant, now: datetime | None = None) -> int:
    """Open sessions whose idle expiry (last access + idle TTL) has passed become `expired`.

    Not reversible; idempotent. Returns how many expired.
    """
    now = now or timezone.now()
    total = 0
    while True:
        with transaction.atomic():
            batch = list(
                Session.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("agent")
                .filter(tenant=tenant, status=SessionStatus.OPEN, expires_at__lt=now)
                .order_by("expires_at")[:BATCH]
            )
            _session_retire(
                tenant=tenant, sessions=batch, status=SessionStatus.EXPIRED, reason="idle_ttl", now=now
            )
        total += len(batch)
        if len(batch) < BATCH:
            return total


def sessions_evict_over_limit(
    *, tenant: Tenant, agent: Agent, limit: int, now: datetime | None = None
) -> int:
    """Evict the agent's least recently accessed open sessions beyond `limit` (status `evicted`).

    Runs in the caller's transaction when there is one (session_create calls it). Returns the count.
    """
    now = now or timezone.now()
    with transaction.atomic():
        extra = list(
            Session.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("agent")
            .filter(tenant=tenant, agent=agent, status=SessionStatus.OPEN)
            .order_by("-last_accessed_at", "-pk")[limit:]
        )
        _session_retire(
            tenant=tenant, sessions=extra, status=SessionStatus.EVICTED, reason="live_limit", now=now
        )
    return len(extra)


def sessions_enforce_live_limit(*, tenant: Tenant, now: datetime | None = None) -> int:
    """For every agent of the tenant over the policy's live-session limit, evict the LRU extras."""
    limit = SessionRetentionPolicy.for_tenant(tenant).max_live_sessions_per_agent
    crowded = (
        Session.objects.filter(tenant=tenant, status=SessionStatus.OPEN)
        .values("agent_id")
        .annotate(live=Count("id"))
        .filter(live__gt=limit)
    )
    agents = Agent.objects.filter(pk__in=[row["agent_id"] for row in crowded])
    return sum(
        sessions_evict_over_limit(tenant=tenant, agent=agent, limit=limit, now=now) for agent in agents
    )


def _tasks_retire(*, tenant: Tenant, tasks: list[Task], reason: str) -> None:
    for task in tasks:
        recorder.event_append(
            tenant=tenant,
            type="retention.evicted",
            agent=task.agent,
            session=task.session,
            payload={"kind": "task", "id": task.public_id, "reason": reason, "status": task.status},
        )
    Task.objects.filter(pk__in=[t.pk for t in tasks]).delete()


def tasks_purge(*, tenant: Tenant, now: datetime | None = None) -> int:
    """Delete tasks past the policy's age (created more than task_retention_days ago, or past their
    own expires_at) and, beyond max_tasks, the oldest. Their events stay. Returns the count."""
    now = now or timezone.now()
    policy = SessionRetentionPolicy.for_tenant(tenant)
    cutoff = now - timedelta(days=policy.task_retention_days)
    total = 0
    while True:
        with transaction.atomic():
            old = list(
                Task.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("agent", "session")
                .filter(tenant=tenant)
                .filter(created_at__lt=cutoff)
                .order_by("created_at")[:BATCH]
            ) + list(
                Task.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("agent", "session")
                .filter(tenant=tenant, expires_at__lt=now, created_at__gte=cutoff)
                .order_by("created_at")[:BATCH]
            )
            _tasks_retire(tenant=tenant, tasks=old, reason="age")
        total += len(old)
        if len(old) < BATCH:
            break
    while True:
        with transaction.atomic():
            over = list(
                Task.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("agent", "session")
                .filter(tenant=tenant)
                .order_by("-created_at", "-pk")[policy.max_tasks : policy.max_tasks + BATCH]
            )
            _tasks_retire(tenant=tenant, tasks=over, reason="task_limit")
        total += len(over)
        if len(over) < BATCH:
            return total


def events_purge(*, tenant: Tenant, now: datetime | None = None) -> int:
    """Delete the tenant's events older than the policy's event_retention_days (0 = keep forever).

    The only code that deletes events. Leaves one `retention.evicted` event (kind `events`) on
    the tenant stream saying how many went and up to when. Recorded OTLP span ids of that age go too.
    """
    now = now or timezone.now()
    days = SessionRetentionPolicy.for_tenant(tenant).event_retention_days
    if not days:
        return 0
    cutoff = now - timedelta(days=days)
    with transaction.atomic():
        deleted, _ = Event.objects.filter(tenant=tenant, created_at__lt=cutoff).delete()
        # The span ids that keep OTLP ingest idempotent live as long as the events they produced.
        OtelSpan.objects.filter(tenant=tenant, created_at__lt=cutoff).delete()
        if deleted:
            recorder.event_append(
                tenant=tenant,
                type="retention.evicted",
                payload={"kind": "events", "count": deleted, "reason": "age", "before": cutoff.isoformat()},
            )
    return deleted


def idempotency_purge(*, now: datetime | None = None) -> int:
    """Delete stored Idempotency-Key responses older than CTXAPP_IDEMPOTENCY_TTL_HOURS (all tenants)."""
    now = now or timezone.now()
    cutoff = now - timedelta(hours=settings.CTXAPP.idempotency_ttl_hours)
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=cutoff).delete()
    return deleted


def store_items_purge(*, now: datetime | None = None, batch: int = 5000) -> int:
    """Delete LangGraph store items past their TTL (all tenants), in batches of `batch` rows.

    A store that is written purges its own expired items as it goes (store_expired_purge); this
    sweep covers the owners that stopped writing, so nothing outlives its TTL on disk for long."""
    now = now or timezone.now()
    deleted = 0
    while True:
        pks = list(StoreItem.objects.filter(expires_at__lte=now).values_list("pk", flat=True)[:batch])
        if not pks:
            return deleted
        deleted += StoreItem.objects.filter(pk__in=pks).delete()[0]


def retention_run(*, now: datetime | None = None) -> RetentionReport:
    """Apply every tenant's retention policy once. Idempotent; safe to run concurrently."""
    now = now or timezone.now()
    report = RetentionReport()
    for tenant in Tenant.objects.order_by("pk"):
        report.sessions_expired += sessions_expire_idle(tenant=tenant, now=now)
        report.sessions_evicted += sessions_enforce_live_limit(tenant=tenant, now=now)
        report.tasks_purged += tasks_purge(tenant=tenant, now=now)
        report.events_purged += events_purge(tenant=tenant, now=now)
    report.idempotency_purged = idempotency_purge(now=now)
    report.store_items_purged = store_items_purge(now=now)
    return report
