"""Durable background jobs: a transactional outbox in front of Celery.

A service that implies a job calls `job_enqueue` inside its own transaction. That writes a
JobIntent row next to the data, so the job exists exactly when the write does. After commit the
intent is dispatched to Celery (`memory.jobs.run`, its id as the only argument); a broker that is
down is logged and never fails the request. Celery beat runs `jobs_sweep` every
CTXAPP_JOB_SWEEP_SECONDS: it dispatches again every intent not taken CTXAPP_JOB_REDISPATCH_SECONDS
after its last dispatch (broker down, or a broker that lost its messages) and every intent whose
runner died.

Exactly once: `job_run` takes the intent row with `FOR UPDATE SKIP LOCKED` and holds that lock
for the whole run, in the transaction that does the job's writes and marks it done. A second
delivery of the same intent finds it locked (a live runner has it) or done: it does nothing. A
runner killed mid-job (SIGKILL, a lost connection) rolls back, which releases the lock; its
intent is then `running` but unlocked, which is how the sweep knows the runner is gone, with no
timeout to tune. Jobs run inside that transaction, so they must not commit on their own.

Kinds (HANDLERS): `experiences.embed` (coalesced: one run takes up to CTXAPP_EMBEDDING_BATCH_SIZE
pending experiences from every pending embedding intent), `task.distill` (full distillation of a
finished task), `session.summarise`. Each records its outcome on the intent row: `done` with a
result, or `failed` with the reason; the dashboard's jobs page lists them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from memory.models import JobIntent, JobStatus, Tenant

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 600.0
SWEEP_LIMIT = 1000


class PermanentJobError(Exception):
    """The job cannot succeed by retrying; the intent becomes `failed` with this reason."""


@dataclass(frozen=True)
class JobKind:
    """How to run one kind of job. `run(intents)` does the work inside the runner's transaction
    and returns a JSON-able result; `transient` exceptions retry with backoff up to
    `max_attempts()` runs, then (like any other exception) call `on_failure(intents, reason)`
    and mark the intents failed."""

    run: Callable[[list[JobIntent]], Any]
    transient: tuple[type[BaseException], ...] = (OperationalError,)
    max_attempts: Callable[[], int] = lambda: 6
    backoff: Callable[[], float] = lambda: 5.0
    on_failure: Callable[[list[JobIntent], str], None] | None = None
    merge: Callable[[JobIntent], list[JobIntent]] | None = field(default=None)


HANDLERS: dict[str, JobKind] = {}


def job_kind_register(kind: str, handler: JobKind) -> None:
    HANDLERS[kind] = handler


# --- enqueue ----------------------------------------------------------------------------------


def job_enqueue(*, tenant: Tenant | None, kind: str, key: str, payload: dict[str, Any]) -> int | None:
    """Record that `kind` must run for `key`, in the caller's transaction; dispatch after commit.

    Coalesces: while an intent of the same (kind, key) is pending (not taken yet), a second
    call writes nothing and returns None. Returns the new intent's id. Never raises for the
    broker: a failed dispatch is retried by the sweep.
    """
    if kind not in HANDLERS:
        raise ValueError(f"unknown job kind {kind!r}")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {JobIntent._meta.db_table}
                (tenant_id, kind, key, payload, status, attempts, error, created_at, dispatched_at)
            VALUES (%s, %s, %s, %s::jsonb, 'pending', 0, '', now(), now())
            ON CONFLICT DO NOTHING
            RETURNING id
            """,
            [tenant.pk if tenant is not None else None, kind, key[:200], _json(payload)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    intent_id = int(row[0])
    transaction.on_commit(lambda: job_dispatch(intent_ids=[intent_id]))
    return intent_id


def job_intent_update_payload(*, intent_id: int, payload: dict[str, Any]) -> bool:
    """Replace a pending intent's payload (its writer adding to it before commit). False if it
    is no longer pending (then the caller enqueues a new one)."""
    return bool(JobIntent.objects.filter(pk=intent_id, status=JobStatus.PENDING).update(payload=payload))


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


_last_broker_warning = [0.0]


def job_dispatch(*, intent_ids: list[int], countdown: float | None = None) -> int:
    """Send one Celery message per intent. Never raises: returns how many were sent.

    A broker that refuses is logged (at most once a minute); the intents stay pending and the
    sweep dispatches them again once the broker is back.
    """
    from memory.tasks.jobs import job_run_task

    return tasks_send(job_run_task, [(intent_id,) for intent_id in intent_ids], countdown=countdown)


def tasks_send(task: Any, calls: list[tuple[Any, ...]], *, countdown: float | None = None) -> int:
    """Send `task` once per argument tuple in `calls`, without waiting on a broker that is down.

    Never raises: returns how many were sent. Callers keep what was not sent (an intent, a
    pending row) for a sweep to send again.
    """
    from ctxapp.celery import app

    # Our own connection, told not to retry: Kombu's default retries a refused connection for
    # about 6 s, inside the request. A failure here costs the request nothing; the sweep retries.
    options = dict(app.conf.broker_transport_options or {})
    if str(app.conf.broker_write_url or app.conf.broker_url).startswith(("redis", "rediss", "amqp")):
        options["max_retries"] = 0  # (the SQLAlchemy transport would hand it to create_engine)
    sent = 0
    conn = app.connection_for_write(transport_options=options)
    try:
        producer = conn.Producer()
        for args in calls:
            task.apply_async(args, countdown=countdown, retry=False, producer=producer)
            sent += 1
    except Exception as exc:  # any broker failure: the caller keeps the job
        now = time.monotonic()
        if now - _last_broker_warning[0] > 60:
            _last_broker_warning[0] = now
            logger.warning(
                "broker unavailable, %d jobs kept for the sweep: %s: %s",
                len(calls) - sent,
                type(exc).__name__,
                exc,
            )
    finally:
        conn.release()
    return sent


# --- run ----------------------------------------------------------------------------------------


def job_run(*, intent_id: int) -> str:
    """Run the job of intent `intent_id` once. Idempotent; returns what happened.

    "done", "failed", "retry" (transient error, a later run is scheduled), or "skipped" (already
    done, running under a live runner, merged into another run, not due yet, or missing).
    """
    table = JobIntent._meta.db_table
    # A visible marker for the jobs page and the attempt count (committed at once). The row lock
    # taken below is what decides who runs it: two runners may both mark it, one gets the lock.
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {table} SET status = 'running', taken_at = %s, attempts = attempts + 1
            WHERE id = (
                SELECT id FROM {table}
                WHERE id = %s AND status IN ('pending', 'running') AND (run_after IS NULL OR run_after <= %s)
                FOR UPDATE SKIP LOCKED
            )
            RETURNING attempts
            """,
            [timezone.now(), intent_id, timezone.now()],
        )
        row = cursor.fetchone()
    if row is None:
        return "skipped"
    attempts = int(row[0])
    handler: JobKind | None = None
    intents: list[JobIntent] = []
    try:
        with transaction.atomic():
            intent = (
                JobIntent.objects.select_for_update(skip_locked=True)
                .filter(pk=intent_id, status=JobStatus.RUNNING)
                .first()
            )
            if intent is None:  # another runner took it between the two statements
                return "skipped"
            handler = HANDLERS.get(intent.kind)
            if handler is None:
                raise PermanentJobError(f"unknown job kind {intent.kind!r}")
            merged = handler.merge(intent) if handler.merge else []
            intents = [intent, *merged]
            if merged:
                JobIntent.objects.filter(pk__in=[i.pk for i in merged]).update(
                    attempts=F("attempts") + 1, taken_at=timezone.now(), merged_into=intent.pk
                )
            result = handler.run(intents)
            JobIntent.objects.filter(pk__in=[i.pk for i in intents]).update(
                status=JobStatus.DONE, finished_at=timezone.now(), result=result, error="", run_after=None
            )
        return "done"
    except Exception as exc:
        return _after_failure(
            intent_id=intent_id, attempts=attempts, handler=handler, intents=intents, exc=exc
        )


def _after_failure(
    *, intent_id: int, attempts: int, handler: JobKind | None, intents: list[JobIntent], exc: Exception
) -> str:
    reason = f"{type(exc).__name__}: {exc}"[:2000]
    transient = handler is not None and isinstance(exc, handler.transient)
    if transient and handler is not None and attempts < handler.max_attempts():
        delay = min(MAX_BACKOFF_SECONDS, handler.backoff() * 2 ** (attempts - 1))
        logger.info("job %s attempt %d failed, retry in %.1fs: %s", intent_id, attempts, delay, reason)
        # Still `running` (not pending): new work for the same key must not coalesce into a job
        # that already read its input. The merged intents go back to pending for any runner.
        now = timezone.now()
        JobIntent.objects.filter(pk=intent_id).update(
            error=reason, run_after=now + timedelta(seconds=delay), dispatched_at=now
        )
        job_dispatch(intent_ids=[intent_id], countdown=delay)
        return "retry"
    if transient:
        reason = f"gave up after {attempts} attempts: {reason}"
    logger.warning("job %s failed: %s", intent_id, reason)
    with transaction.atomic():
        if handler is not None and handler.on_failure is not None and intents:
            handler.on_failure(intents, reason)
        JobIntent.objects.filter(
            pk__in=[i.pk for i in intents] or [intent_id], status__in=[JobStatus.RUNNING, JobStatus.PENDING]
        ).update(status=JobStatus.FAILED, error=reason, finished_at=timezone.now())
    return "failed"


# --- sweep --------------------------------------------------------------------------------------


def jobs_sweep(*, redispatch_after: float | None = None) -> int:
    """Dispatch again every open intent that is neither taken nor due to a live runner.

    Pending intents whose last dispatch is older than CTXAPP_JOB_REDISPATCH_SECONDS (the broker
    was down or lost the message), and running intents nobody holds (their runner died): both
    are found with SKIP LOCKED, so a job a live worker is running is never touched. Returns how
    many were dispatched. Safe to run at any time.
    """
    seconds = redispatch_after if redispatch_after is not None else settings.CTXAPP.job_redispatch_seconds
    now = timezone.now()
    cutoff = now - timedelta(seconds=seconds)
    with transaction.atomic():
        stale = (
            JobIntent.objects.select_for_update(skip_locked=True)
            .filter(status__in=[JobStatus.PENDING, JobStatus.RUNNING])
            .exclude(run_after__gt=now)
        )
        pending = stale.filter(status=JobStatus.PENDING, dispatched_at__lt=cutoff)
        # A running intent nobody holds lost its runner (the lock dies with it): dispatched again
        # after one sweep period (not the redispatch bound), once per period while it waits.
        orphan_cutoff = now - timedelta(seconds=settings.CTXAPP.job_sweep_seconds)
        orphaned = stale.filter(status=JobStatus.RUNNING).exclude(dispatched_at__gte=orphan_cutoff)
        ids = sorted(
            {
                *pending.values_list("pk", flat=True)[:SWEEP_LIMIT],
                *orphaned.values_list("pk", flat=True)[:SWEEP_LIMIT],
            }
        )
        if ids:
            JobIntent.objects.filter(pk__in=ids).update(dispatched_at=now)
    if ids:
        logger.info("job sweep: dispatching %d intents again", len(ids))
        job_dispatch(intent_ids=ids)
    return len(ids)


def jobs_purge(*, older_than: timedelta | None = None) -> int:
    """Delete finished intents (done or failed) older than CTXAPP_JOB_KEEP_DAYS. Returns how many."""
    days = settings.CTXAPP.job_keep_days
    cutoff = timezone.now() - (older_than if older_than is not None else timedelta(days=days))
    deleted, _ = JobIntent.objects.filter(
        status__in=[JobStatus.DONE, JobStatus.FAILED], finished_at__lt=cutoff
    ).delete()
    return int(deleted)


def jobs_waiting() -> int:
    """How many intents are not finished (waiting for a worker or running). Read-only."""
    return JobIntent.objects.filter(status__in=[JobStatus.PENDING, JobStatus.RUNNING]).count()


# --- the kinds ----------------------------------------------------------------------------------

EMBED = "experiences.embed"
DISTILL = "task.distill"
SUMMARISE = "session.summarise"


def _embed_ids(intents: list[JobIntent]) -> list[int]:
    ids: list[int] = []
    for intent in intents:
        ids.extend(int(i) for i in (intent.payload or {}).get("ids", []))
    return sorted(set(ids))


def _embed_merge(intent: JobIntent) -> list[JobIntent]:
    """Other pending embedding intents, oldest first, up to one batch of experiences in all."""
    batch = settings.CTXAPP.embedding_batch_size
    room = batch - len(_embed_ids([intent]))
    merged: list[JobIntent] = []
    if room <= 0:
        return merged
    candidates = (
        JobIntent.objects.select_for_update(skip_locked=True)
        .filter(kind=EMBED, status=JobStatus.PENDING)
        .exclude(pk=intent.pk)
        .order_by("pk")[:batch]
    )
    for other in candidates:
        size = len(_embed_ids([other]))
        if size > room:
            break
        merged.append(other)
        room -= size
    return merged


def _embed_run(intents: list[JobIntent]) -> dict[str, Any]:
    from memory.services.experiences import experiences_embed

    ids = _embed_ids(intents)
    return {"experiences": len(ids), "embedded": experiences_embed(experience_ids=ids)}


def _embed_failed(intents: list[JobIntent], reason: str) -> None:
    from memory.services.experiences import experiences_mark_failed

    experiences_mark_failed(experience_ids=_embed_ids(intents), reason=reason)


def _distill_run(intents: list[JobIntent]) -> dict[str, Any]:
    from memory.models import Task
    from memory.services.distillation import task_distill_full

    task = (
        Task.objects.filter(pk=intents[0].payload.get("task"))
        .select_related("tenant", "session", "agent")
        .first()
    )
    if task is None:  # purged meanwhile: nothing to learn from
        return {"skipped": "task deleted"}
    return {"task": task.public_id, "experiences": len(task_distill_full(tenant=task.tenant, task=task))}


def _summarise_run(intents: list[JobIntent]) -> dict[str, Any]:
    from memory.models import Session
    from memory.services.summarise import session_summarise

    session = (
        Session.objects.select_related("tenant", "agent").filter(pk=intents[0].payload.get("session")).first()
    )
    if session is None:
        return {"skipped": "session deleted"}
    summary = session_summarise(tenant=session.tenant, session=session)
    return {"session": session.public_id, "summary": summary.public_id if summary else None}


def _register_kinds() -> None:
    from memory.services.embedding import EmbedderUnavailable

    conf = settings.CTXAPP
    job_kind_register(
        EMBED,
        JobKind(
            run=_embed_run,
            transient=(EmbedderUnavailable, OperationalError),
            max_attempts=lambda: conf.embedding_max_retries + 1,
            backoff=lambda: conf.embedding_retry_backoff,
            on_failure=_embed_failed,
            merge=_embed_merge,
        ),
    )
    job_kind_register(DISTILL, JobKind(run=_distill_run))
    job_kind_register(SUMMARISE, JobKind(run=_summarise_run))


_register_kinds()
