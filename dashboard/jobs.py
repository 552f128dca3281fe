"""What "jobs" means on the dashboard, honestly.

ctxapp's background work is Celery tasks on one broker, Redis. Celery keeps no history without a
result backend, and we run without one, so:

- job records = the jobs outbox (memory/services/jobs.py): every job kind (distillation,
  summarisation, digest, embedding) records its outcome on its JobIntent row, `done` with a result
  or `failed` with the reason, so the page lists them all the same way;
- queue depth = the number of messages waiting in each queue, asked of the broker itself;
- running jobs = the job records a runner holds now (from the database, with any broker), plus
  what the workers report through Celery's remote control (`inspect().active()`);
- failed jobs = the recorded events whose type ends in `.failed` / `_failed` (every capability
  records its job failures as events, with the ids needed to retry);
- progress = the latest `*.progress` event of each long job (`done` / `total` in the payload);
- retry = the owning capability's service (RETRY_HANDLERS: today the embedding retry of the
  experience-memory capability); a failure without one says it cannot be retried from here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import current_app as app
from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from dashboard.selectors import failed_events
from memory.exceptions import NotFound
from memory.models import Event, Experience, JobIntent, JobStatus, Session, Task, Tenant
from memory.services import jobs as job_kinds
from memory.services.experiences import experiences_retry_failed

logger = logging.getLogger(__name__)

INSPECT_TIMEOUT = 0.5
JOB_RECORDS_SHOWN = 25

# Failed-job event type -> how to retry it: the owning capability's service, called with the
# ids the failure event recorded. Each adapter returns a message for the operator.


def _retry_embedding(*, tenant: Tenant, event: Event) -> str:
    experience = event.payload.get("experience")
    try:
        count = experiences_retry_failed(tenant=tenant, experience_ids=[experience] if experience else None)
    except NotFound:
        return f"Nothing to retry: {experience} no longer exists."
    if not count:
        return f"Nothing to retry: {experience} is no longer failed (already retried or embedded)."
    return f"Embedding of {experience} queued again."


RetryHandler = Callable[..., str]  # (*, tenant, event) -> a message for the operator

RETRY_HANDLERS: dict[str, RetryHandler] = {
    # event type prefix: the service adapter that retries such a failure
    "experience.embedding_failed": _retry_embedding,
}


@dataclass
class QueueDepth:
    name: str
    depth: int | None
    error: str = ""


def queue_names() -> list[str]:
    names = [settings.CELERY_TASK_DEFAULT_QUEUE]
    routes = getattr(settings, "CELERY_TASK_ROUTES", None) or {}
    if isinstance(routes, dict):
        for route in routes.values():
            queue = route.get("queue") if isinstance(route, dict) else None
            if queue and queue not in names:
                names.append(queue)
    return names


_depth_cache: tuple[float, list[QueueDepth]] | None = None
DEPTH_CACHE_SECONDS = 2.0


def queue_depths() -> list[QueueDepth]:
    """Messages waiting in each queue, asked of the broker (passive declare). Never raises.

    Cached for 2 s per process: live pages re-render often and the answer is a gauge anyway.
    """
    global _depth_cache
    now = time.monotonic()
    if _depth_cache is not None and now - _depth_cache[0] < DEPTH_CACHE_SECONDS:
        return _depth_cache[1]
    result = _queue_depths_uncached()
    _depth_cache = (now, result)
    return result


def _queue_depths_uncached() -> list[QueueDepth]:
    result = []
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            channel = conn.default_channel
            for name in queue_names():
                try:
                    ok = channel.queue_declare(queue=name, passive=True)
                    result.append(QueueDepth(name=name, depth=int(ok.message_count)))
                except Exception as exc:
                    logger.debug("queue %s: %s", name, exc)
                    if "NOT_FOUND" in str(exc):  # a queue nobody declared yet (or emptied): none wait
                        result.append(QueueDepth(name=name, depth=0))
                    else:  # the broker answered, but not with a count: unknown, not zero
                        result.append(QueueDepth(name=name, depth=None, error=f"queue unreadable: {exc}"))
    except Exception as exc:
        return [
            QueueDepth(name=name, depth=None, error=f"broker unreachable: {exc}") for name in queue_names()
        ]
    return result


def outbox_waiting(*, tenant: Tenant) -> int:
    """The tenant's jobs in the outbox not finished yet: while the broker is away, this is where they
    wait (they are sent when it is back). Read-only."""
    return JobIntent.objects.filter(tenant=tenant, status__in=[JobStatus.PENDING, JobStatus.RUNNING]).count()


@dataclass
class RunningJobs:
    available: bool  # whether the workers answered
    note: str
    jobs: list[dict[str, Any]]  # what the workers report
    records: list[JobRow] = field(default_factory=list)  # the tenant's job records taken now


def job_records(*, tenant: Tenant, limit: int = JOB_RECORDS_SHOWN) -> list[JobIntent]:
    """The tenant's finished job records (done or failed, with the result or the reason), newest
    first. Read-only. Embedding runs are batches across tenants (no tenant on their records):
    their outcome per experience is in the `experience.embedded` / `embedding_failed` events."""
    return list(
        JobIntent.objects.filter(tenant=tenant, status__in=[JobStatus.DONE, JobStatus.FAILED])
        .exclude(finished_at=None)
        .order_by("-finished_at", "-pk")[:limit]
    )


# What each job kind does, as an operator would say it.
KIND_WORDS = {
    job_kinds.SUMMARISE: "Summarise the session's older messages",
    job_kinds.DIGEST: "Write the session's digest",
    job_kinds.DISTILL: "Distil the finished task into experiences",
    job_kinds.EMBED: "Embed new experiences",
}
SUBJECT_MODELS: dict[str, Any] = {"session": Session, "task": Task}


@dataclass
class JobRow:
    """A job record in words: what it does, for which session or task (linked), its outcome."""

    record: JobIntent
    what: str
    subject: str  # "session sess_…", "task task_…", or "" when the job is about no one thing
    session_id: str = ""  # the public id to link to, for a session's job


def job_rows(*, tenant: Tenant, records: list[JobIntent]) -> list[JobRow]:
    """Name each record's job and subject: keys like `session:12` become the session's public id
    (one query per subject kind; a subject deleted since shows as "a deleted session")."""
    pks: dict[str, set[int]] = {}
    for record in records:
        prefix, _, pk = record.key.partition(":")
        if prefix in SUBJECT_MODELS and pk.isdigit():
            pks.setdefault(prefix, set()).add(int(pk))
    public = {
        prefix: dict(
            SUBJECT_MODELS[prefix].objects.filter(tenant=tenant, pk__in=ids).values_list("pk", "public_id")
        )
        for prefix, ids in pks.items()
    }
    rows = []
    for record in records:
        prefix, _, pk = record.key.partition(":")
        what = KIND_WORDS.get(record.kind, record.kind.replace(".", " ").replace("_", " "))
        if prefix not in SUBJECT_MODELS or not pk.isdigit():
            rows.append(JobRow(record, what, ""))
            continue
        public_id = public[prefix].get(int(pk), "")
        subject = f"{prefix} {public_id}" if public_id else f"a deleted {prefix}"
        rows.append(JobRow(record, what, subject, public_id if prefix == "session" else ""))
    return rows


def running_jobs(*, tenant: Tenant) -> RunningJobs:
    """Jobs running now: the tenant's job records a runner has taken (read from the database, so
    they show with any broker), and the tasks the workers report (Celery remote control). Never
    raises."""
    records = job_rows(
        tenant=tenant,
        records=list(
            JobIntent.objects.filter(tenant=tenant, status=JobStatus.RUNNING).order_by("taken_at", "pk")[
                :JOB_RECORDS_SHOWN
            ]
        ),
    )
    try:
        inspector = app.control.inspect(timeout=INSPECT_TIMEOUT)
        active = inspector.active() or {}
    except Exception as exc:
        return RunningJobs(False, f"The workers did not answer ({exc}).", [], records)
    jobs = []
    ours = set(queue_names())
    for worker, tasks in active.items():
        for task in tasks or []:
            # Remote control reaches every worker on the broker; keep only jobs of our queues.
            queue = (task.get("delivery_info") or {}).get("routing_key")
            if queue is not None and queue not in ours:
                continue
            started = task.get("time_start")
            jobs.append(
                {
                    "worker": worker,
                    "name": task.get("name", ""),
                    "id": task.get("id", ""),
                    "args": task.get("args"),
                    "started": datetime.fromtimestamp(started, tz=UTC) if started else None,
                }
            )
    note = "" if active else "No worker answered within half a second: none is running, or all are busy."
    return RunningJobs(True, note, jobs, records)


def retry_handler(event_type: str) -> RetryHandler | None:
    """The adapter that retries a failed job of this event type, if there is one."""
    return next((h for prefix, h in RETRY_HANDLERS.items() if event_type.startswith(prefix)), None)


def failed_jobs(*, tenant: Tenant, limit: int = 25) -> list[dict[str, Any]]:
    """Recent job failures (events) with whether each can be retried from the dashboard."""
    rows = []
    for event in failed_events(tenant=tenant, since=timezone.now() - timedelta(days=7))[:limit]:
        rows.append({"event": event, "retryable": retry_handler(event.type) is not None})
    return rows


def job_retry(*, tenant: Tenant, event_id: str) -> str:
    """Retry the failed job recorded by event `event_id` through its capability's service.

    Raises Event.DoesNotExist for a missing or foreign id, LookupError when no service can retry it.
    Returns a message for the operator.
    """
    event = Event.objects.get(tenant=tenant, public_id=event_id)
    handler = retry_handler(event.type)
    if handler is None:
        raise LookupError(f"No service can retry a {event.type} job yet.")
    outcome = handler(tenant=tenant, event=event)
    return str(outcome) if outcome else f"Retry of {event.type} queued."


def job_progress(*, tenant: Tenant, limit: int = 10) -> list[dict[str, Any]]:
    """The latest progress of each long job (events `*.progress` of the last hour)."""
    since = timezone.now() - timedelta(hours=1)
    latest: dict[str, dict[str, Any]] = {}
    for event in Event.objects.filter(
        tenant=tenant, type__endswith=".progress", created_at__gte=since
    ).order_by("-created_at")[:500]:
        job = str(event.payload.get("job") or event.payload.get("job_id") or event.type)
        if job in latest:
            continue
        done, total = event.payload.get("done"), event.payload.get("total")
        pct = (
            round(100 * done / total) if isinstance(done, int) and isinstance(total, int) and total else None
        )
        latest[job] = {
            "job": job,
            "type": event.type,
            "done": done,
            "total": total,
            "pct": pct,
            "at": event.created_at,
        }
        if len(latest) >= limit:
            break
    return list(latest.values())


# Events that record a background job finishing (the Celery tasks of each capability).
JOB_RESULT_TYPES = [
    "experience.embedded",
    "experience.embedding_failed",
    "experience.embedding_retried",
    "memory.distilled",
    "summary.created",
    "digest.updated",
    "fact.decayed",
    "fact.promoted",
    "retention.evicted",
    "session.expired",
]


def job_results(*, tenant: Tenant, limit: int = 15) -> list[Event]:
    """The latest finished background jobs (their result events), newest first."""
    return list(
        Event.objects.filter(tenant=tenant, type__in=JOB_RESULT_TYPES).order_by("-created_at", "-id")[:limit]
    )


def embedding_backlog(*, tenant: Tenant) -> dict[str, Any]:
    """Experiences by embedding status: the progress of the embedding pipeline."""
    counts = dict(
        Experience.objects.filter(tenant=tenant)
        .values_list("embedding_status")
        .annotate(n=Count("id"))
        .values_list("embedding_status", "n")
    )
    total = sum(counts.values())
    done = counts.get("completed", 0)
    return {
        "total": total,
        "completed": done,
        "pending": counts.get("pending", 0),
        "failed": counts.get("failed", 0),
        "pct": round(100 * done / total) if total else 100,
    }
