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

Kinds (KINDS): `experiences.embed` (coalesced: one run takes up to CTXAPP_EMBEDDING_BATCH_SIZE
pending experiences from every pending embedding intent), `task.distill` (full distillation of
finished tasks: a run takes up to distillation.DISTILL_BATCH waiting ones and writes them at
once, a task that fails alone in a savepoint of its own), `session.summarise`, `session.digest`
(the session digest), `user_memory.extract` (memories about the user from a session's new turns,
coalesced per session), `user_memory.embed` (a tenant's pending user memories, coalesced per
tenant). Each records its outcome on the intent row: `done` with a result, or `failed` with the
reason (a run of several may fail one intent alone, `job_intent_fail`); the dashboard's jobs page
lists them.

This module is the facade services use to enqueue, and it imports no service and no task: what
each kind runs is registered (HANDLERS, `job_kind_register`) by memory/tasks/jobs.py, the
adapter that imports the services doing the work; the Celery app and its tasks are reached by
task name (`tasks_send`). So a service that enqueues a job never forms an import cycle with it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import F, Q
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


EMBED = "experiences.embed"
DISTILL = "task.distill"
SUMMARISE = "session.summarise"
DIGEST = "session.digest"
USER_MEMORY_EXTRACT = "user_memory.extract"  # memory/services/user_memory/extraction.py
USER_MEMORY_EMBED = "user_memory.embed"  # memory/services/user_memory/embed.py
KINDS = frozenset({EMBED, DISTILL, SUMMARISE, DIGEST, USER_MEMORY_EXTRACT, USER_MEMORY_EMBED})

JOB_RUN_TASK = "memory.jobs.run"  # memory/tasks/jobs.py `job_run_task`

# What each kind runs: filled by memory/tasks/jobs.py (imported wherever a job runs: the worker
# loads every task module, and job_run is called only by its task).
HANDLERS: dict[str, JobKind] = {}


def job_kind_register(kind: str, handler: JobKind) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown job kind {kind!r}")
    HANDLERS[kind] = handler


# --- enqueue ----------------------------------------------------------------------------------


def job_enqueue(*, tenant: Tenant | None, kind: str, key: str, payload: dict[str, Any]) -> int | None:
    """Record that `kind` must run for `key`, in the caller's transaction; dispatch after commit.

    Coalesces: while an intent of the same (kind, key) is pending (not taken yet), a second
    call writes nothing and returns None. Returns the new intent's id. Never raises for the
    broker: a failed dispatch is retried by the sweep.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown job kind {kind!r}")
    # No savepoint: a failed INSERT aborts the caller's whole transaction anyway.
    with transaction.atomic(savepoint=False), connection.cursor() as cursor:
        cursor.execute(
            _INTENT_INSERT_SQL,
            [tenant.pk if tenant is not None else None, kind, key[:200], _json(payload)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    intent_id = int(row[0])
    job_dispatch_on_commit(intent_id)
    return intent_id


# Coalesces: while an intent of the same kind and key is pending, the partial unique index on
# (kind, key) makes this insert nothing (memory/models/jobs.py).
_INTENT_INSERT_SQL = f"""
    INSERT INTO {JobIntent._meta.db_table}
        (tenant_id, kind, key, payload, status, attempts, error, created_at, dispatched_at)
    VALUES (%s, %s, %s, %s::jsonb, 'pending', 0, '', now(), now())
    ON CONFLICT DO NOTHING
    RETURNING id
"""


def job_dispatch_on_commit(intent_id: int) -> None:
    """Dispatch a recorded intent once the caller's transaction commits. The send never waits
    long on the broker (tasks_send); one that fails leaves the intent pending for the sweep."""
    transaction.on_commit(lambda: job_dispatch(intent_ids=[intent_id]))


def job_intent_update_payload(*, intent_id: int, payload: dict[str, Any]) -> bool:
    """Replace a pending intent's payload (its writer adding to it before commit). False if it
    is no longer pending (then the caller enqueues a new one)."""
    return bool(JobIntent.objects.filter(pk=intent_id, status=JobStatus.PENDING).update(payload=payload))


def _json(value: Any) -> str:
    return json.dumps(value)


_last_broker_warning = [0.0]


def job_dispatch(*, intent_ids: list[int], countdown: float | None = None) -> int:
    """Send one Celery message per intent. Never raises: returns how many were sent.

    A broker that refuses is logged (at most once a minute); the intents stay pending and the
    sweep dispatches them again once the broker is back.
    """
    return tasks_send(JOB_RUN_TASK, [(intent_id,) for intent_id in intent_ids], countdown=countdown)


def tasks_send(task: str | Any, calls: list[tuple[Any, ...]], *, countdown: float | None = None) -> int:
    """Send `task` (a task, or a registered task's name) once per argument tuple in `calls`,
    without waiting on a broker that is down.

    Never raises: returns how many were sent. Callers keep what was not sent (an intent, a
    pending row) for a sweep to send again. A service passes the task's name, so that it never
    imports memory/tasks (which imports the services).
    """
    # The Celery app of this process: ctxapp.celery's, created in MemoryConfig.ready in every
    # Django process (the app `shared_task`s bind to). By name, so that ctxapp.celery, whose beat
    # schedule imports memory/tasks, stays above the services.
    app = current_app
    if isinstance(task, str):
        task = app.signature(task)
    sent = 0
    # This thread's producer; if it was a cached one and fails (a broker restarted under it),
    # once more on a fresh connection, which a broker that is down refuses at once.
    for _attempt in range(2):
        cached = False
        try:
            producer, cached = _producer(app)
            for args in calls[sent:]:
                task.apply_async(args, countdown=countdown, retry=False, producer=producer)
                sent += 1
            return sent
        except Exception as exc:  # any broker failure: the caller keeps the job
            _producer_drop()
            failure = exc
        if not cached:
            break
    now = time.monotonic()
    if now - _last_broker_warning[0] > 60:
        _last_broker_warning[0] = now
        logger.warning(
            "broker unavailable, %d jobs kept for the sweep: %s: %s",
            len(calls) - sent,
            type(failure).__name__,
            failure,
        )
    return sent


# This thread's broker connection and producer, kept between sends: a new connection per send
# cost the PostgreSQL broker a queue declaration (a SELECT, and a connection check) every time,
# ~30 % of a PATCH that finishes a task. Keyed by process (a forked child makes its own) and by
# broker URL and options (tests point the app at another broker).
_producers = threading.local()


def _producer(app: Any) -> tuple[Any, bool]:
    """(a producer on a broker connection told not to retry, whether it is the cached one).
    Kombu's default retries a refused connection for about 6 s, inside the request. Raises
    what a broker that is down raises."""
    options = dict(app.conf.broker_transport_options or {})
    url = str(app.conf.broker_write_url or app.conf.broker_url)
    if url.startswith(("redis", "rediss", "amqp")):
        options["max_retries"] = 0  # (the SQLAlchemy transport would hand it to create_engine)
    key = (os.getpid(), url, repr(sorted(options.items())))
    cached = getattr(_producers, "entry", None)
    if cached is not None and cached[0] == key:
        return cached[2], True
    _producer_drop()
    conn = app.connection_for_write(transport_options=options)
    try:
        producer = conn.Producer()
    except Exception:
        conn.release()
        raise
    _producers.entry = (key, conn, producer)
    return producer, False


def _producer_drop() -> None:
    """Forget this thread's cached producer, releasing its connection (if this process made it)."""
    cached = getattr(_producers, "entry", None)
    _producers.entry = None
    if cached is not None and cached[0][0] == os.getpid():
        with contextlib.suppress(Exception):
            cached[1].release()


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
            JobIntent.objects.filter(pk__in=[i.pk for i in intents]).exclude(status=JobStatus.FAILED).update(
                status=JobStatus.DONE, finished_at=timezone.now(), result=result, error="", run_after=None
            )
        return "done"
    except Exception as exc:
        return _after_failure(
            intent_id=intent_id, attempts=attempts, handler=handler, intents=intents, exc=exc
        )


def job_intent_fail(*, intent_id: int, reason: str) -> None:
    """Inside a run of several intents: mark one of them failed for good (its own input could not
    be processed) while the run goes on; the others end `done` with the run."""
    JobIntent.objects.filter(pk=intent_id).update(
        status=JobStatus.FAILED, error=reason[:2000], finished_at=timezone.now()
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
    # A running intent nobody holds lost its runner (the lock dies with it): dispatched again
    # after one sweep period (not the redispatch bound), once per period while it waits.
    orphan_cutoff = now - timedelta(seconds=settings.CTXAPP.job_sweep_seconds)
    due = Q(status=JobStatus.PENDING, dispatched_at__lt=cutoff) | (
        Q(status=JobStatus.RUNNING) & ~Q(dispatched_at__gte=orphan_cutoff)
    )
    # The sweep runs every CTXAPP_JOB_SWEEP_SECONDS on an idle server too: when no intent is due
    # (the common case), one statement, not a locking transaction of four.
    if not JobIntent.objects.filter(due).exclude(run_after__gt=now).exists():
        return 0
    with transaction.atomic():
        stale = (
            JobIntent.objects.select_for_update(skip_locked=True)
            .filter(status__in=[JobStatus.PENDING, JobStatus.RUNNING])
            .exclude(run_after__gt=now)
        )
        pending = stale.filter(status=JobStatus.PENDING, dispatched_at__lt=cutoff)
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


# --- the kinds' shared helpers (their handlers: memory/tasks/jobs.py) ---------------------------


def embed_intent_ids(intents: list[JobIntent]) -> list[int]:
    ids: list[int] = []
    for intent in intents:
        ids.extend(int(i) for i in (intent.payload or {}).get("ids", []))
    return sorted(set(ids))


def embed_intents_merge(intent: JobIntent) -> list[JobIntent]:
    """Other pending embedding intents, oldest first, up to one batch of experiences in all."""
    batch = settings.CTXAPP.embedding_batch_size
    room = batch - len(embed_intent_ids([intent]))
    merged: list[JobIntent] = []
    if room <= 0:
        return merged
    candidates = (
        JobIntent.objects.filter(kind=EMBED, status=JobStatus.PENDING)
        .exclude(pk=intent.pk)
        .order_by("pk")
        .only("pk", "payload")[:batch]
    )
    chosen: list[int] = []
    for other in candidates:
        size = len(embed_intent_ids([other]))
        if size > room:
            break
        chosen.append(other.pk)
        room -= size
    if not chosen:
        return merged
    # Only the intents this run takes are locked (SKIP LOCKED: one another runner holds is left
    # to it). A pending intent locked but left out would be skipped by the worker its own message
    # reaches, and then wait for the sweep: a second worker ran almost nothing.
    merged = list(
        JobIntent.objects.select_for_update(skip_locked=True)
        .filter(pk__in=chosen, kind=EMBED, status=JobStatus.PENDING)
        .order_by("pk")
    )
    return merged


def embed_max_attempts() -> int:
    return settings.CTXAPP.embedding_max_retries + 1


def embed_backoff() -> float:
    return settings.CTXAPP.embedding_retry_backoff
