"""The memory index: every message searchable by its words at once and by its meaning soon after.

Full text: PostgreSQL computes `Message.search_vector` (a generated tsvector of the speaker name
and the content, in the tenant's text-search configuration) inside the INSERT itself.

Meaning: messages are written `pending`; after the commit, one *drain* job (not one per row, not
one per append) claims up to CTXAPP_MEMORY_EMBED_BATCH pending rows with `FOR UPDATE SKIP
LOCKED`, embeds them with the configured embedder (through the shared EmbeddingCache), writes
the vectors, and repeats while full batches remain (for about CTXAPP_MEMORY_DRAIN_SECONDS, then
it hands over to a fresh job). Dispatches coalesce through `MemoryIndexState.drain_scheduled`:
while a queued job has not started, further commits queue nothing.

Failures: a transient embedder error (EmbedderUnavailable) counts an attempt on the claimed
rows and the job retries with exponential backoff; after CTXAPP_EMBEDDING_MAX_RETRIES attempts,
or at once on a permanent error, the rows become `failed` with the reason. A dispatch that fails
after the commit (broker down) is logged, never raised: the beat sweep (`memory_index_sweep`,
every minute) re-dispatches whenever rows have been pending longer than
CTXAPP_MEMORY_INDEX_STALE_SECONDS, so a broker hiccup or a killed worker never loses indexing.

A tenant whose MemoryPolicy has `embed_messages` off gets its messages `skipped` (still found by
words).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery import signature
from django.conf import settings
from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import Count, F
from django.utils import timezone

from memory.models import (
    MemoryIndexState,
    MemoryPolicy,
    Message,
    MessageEmbeddingStatus,
    Tenant,
)
from memory.services import jobs
from memory.services.content_generation import content_generation_bump
from memory.services.embedding import (
    EmbedderError,
    EmbedderUnavailable,
    text_hash,
    vector_texts_cached,
)
from memory.services.ranking import index_text

logger = logging.getLogger(__name__)

DRAIN_TASK_NAME = "memory.index.drain"  # memory/tasks/memory.py

# --- the tenant's policy ------------------------------------------------------------------------


def memory_policy_get(*, tenant: Tenant) -> MemoryPolicy:
    """The tenant's MemoryPolicy (created on first use), read once per process while the tenant's
    configuration is unchanged (memory/models/policy_cache.py)."""
    return MemoryPolicy.for_tenant(tenant)


def message_index_fields(*, tenant: Tenant) -> dict[str, str]:
    """The index fields a new message of `tenant` is written with (search config, embedding status)."""
    policy = memory_policy_get(tenant=tenant)
    return {
        "search_config": policy.text_search_config or "english",
        "embedding_status": (
            MessageEmbeddingStatus.PENDING if policy.embed_messages else MessageEmbeddingStatus.SKIPPED
        ),
    }


def embedding_text(*, name: str, content: str, occurred_at: datetime | None) -> str:
    """What is embedded for a message: ranking.index_text — '(8 May 2023) Caroline: content'.

    Memory search hands rank() the same string, so dense and lexical signals see one text.
    """
    return index_text(content=content, speaker=name or None, occurred_at=occurred_at)


# --- dispatch -------------------------------------------------------------------------------------

_local = threading.local()


def memory_index_dispatch_on_commit() -> None:
    """Ask for a drain job once the current transaction commits (at most once per transaction).

    Outside a transaction it dispatches now. Never raises: a failed dispatch is logged and the
    sweep recovers the rows.
    """
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        memory_index_dispatch()
        return
    # After a rollback our callback is gone from the connection: register it again.
    if any(entry[1] is memory_index_dispatch for entry in conn.run_on_commit):
        return
    transaction.on_commit(memory_index_dispatch)


def memory_index_dispatch(*, force: bool = False) -> bool:
    """Queue a drain job unless one is queued and not yet started (or `force`). Never raises.

    Returns whether a job was queued.
    """
    now = timezone.now()
    table = MemoryIndexState._meta.db_table
    try:
        with connection.cursor() as cursor:
            if not force and _drain_queued(cursor, table):
                return False
            cursor.execute(
                f"INSERT INTO {table} (id, drain_scheduled, scheduled_at) VALUES (1, true, %s) "
                "ON CONFLICT (id) DO UPDATE SET drain_scheduled = true, "
                "scheduled_at = EXCLUDED.scheduled_at "
                f"WHERE {table}.drain_scheduled = false OR %s RETURNING id",
                [now, force],
            )
            claimed = cursor.fetchone() is not None
    except Exception:
        logger.exception("memory index: could not record a drain dispatch; the sweep will retry")
        return False
    if not claimed:
        return False
    # By name: the task module (an adapter over this one) imports this service, not the reverse.
    if not jobs.tasks_send(signature(DRAIN_TASK_NAME), [()]):  # never waits on a broker that is down
        MemoryIndexState.objects.filter(pk=1).update(drain_scheduled=False)
        return False
    return True


def _drain_queued(cursor: CursorWrapper, table: str) -> bool:
    """Whether a queued drain has not started yet: a plain read, no lock, no write, no commit.

    Skipping the claim on it keeps the claim's guarantee. The caller's messages are committed
    before this read; a drain seen queued clears the flag only after the read, and claims pending
    rows only after clearing it, so its claim sees them (or a concurrent drain holds them). Every
    append would otherwise lock and rewrite the one global row, each in a commit of its own.
    """
    cursor.execute(f"SELECT drain_scheduled FROM {table} WHERE id = 1")
    row = cursor.fetchone()
    return bool(row and row[0])


# --- the drain ------------------------------------------------------------------------------------


@dataclass
class DrainResult:
    batches: list[int] = field(default_factory=list)  # rows completed per batch
    failed: int = 0
    skipped: int = 0
    handed_over: bool = False

    @property
    def completed(self) -> int:
        return sum(self.batches)


def messages_embed_batch(*, batch_size: int | None = None) -> tuple[int, int, int]:
    """Claim up to `batch_size` pending messages and embed them: (completed, failed, skipped).

    One transaction: rows are claimed `FOR UPDATE SKIP LOCKED` (concurrent drains never take the
    same row; a redelivered job finds them done). Rows of tenants whose policy turned embedding
    off become `skipped`; empty messages `skipped`. Raises EmbedderUnavailable after counting
    the attempt on the claimed rows (they stay pending, or become `failed` after
    CTXAPP_EMBEDDING_MAX_RETRIES attempts) — raised after the commit, so the count sticks.
    A permanent EmbedderError marks them `failed`.
    """
    size = batch_size or settings.CTXAPP.memory_embed_batch
    transient: EmbedderUnavailable | None = None
    failed = 0
    with transaction.atomic():
        rows = _pending_claim(size=size)
        if not rows:
            return 0, 0, 0
        todo, skipped = _unembeddable_skip(rows)
        if not todo:
            return 0, 0, skipped
        texts = {
            r.pk: (r.tenant_id, embedding_text(name=r.name, content=r.content, occurred_at=r.occurred_at))
            for r in todo
        }
        try:
            model_name, literals = vector_texts_cached({(t, text_hash(x)): x for t, x in texts.values()})
        except EmbedderUnavailable as exc:
            failed, retrying = _attempt_count(todo, exc)
            transient = exc if retrying else None
        except EmbedderError as exc:
            return 0, _failure_mark(todo, exc), skipped
        else:
            _vectors_write(model_name, {pk: literals[(t, text_hash(x))] for pk, (t, x) in texts.items()})
            return len(todo), 0, skipped
    if transient is not None:
        raise transient
    return 0, failed, skipped


def _pending_claim(*, size: int) -> list[Message]:
    """Up to `size` of the oldest pending messages, locked; rows another drain holds are skipped."""
    return list(
        Message.objects.select_for_update(skip_locked=True)
        .filter(embedding_status=MessageEmbeddingStatus.PENDING)
        .order_by("created_at")
        .only("pk", "tenant_id", "name", "content", "occurred_at", "embedding_attempts")[:size]
    )


def _unembeddable_skip(rows: list[Message]) -> tuple[list[Message], int]:
    """Mark `skipped` the rows of tenants with embedding off and the empty ones: (the rest, skipped)."""
    policies = {
        p.tenant_id: p.embed_messages
        for p in MemoryPolicy.objects.filter(tenant_id__in={r.tenant_id for r in rows})
    }
    skip = {r.pk for r in rows if not policies.get(r.tenant_id, True) or not r.content.strip()}
    if skip:
        Message.objects.filter(pk__in=skip).update(embedding_status=MessageEmbeddingStatus.SKIPPED)
    return [r for r in rows if r.pk not in skip], len(skip)


def _attempt_count(rows: list[Message], exc: EmbedderUnavailable) -> tuple[int, bool]:
    """Count a transient failure on the rows; those out of attempts become `failed`.

    Returns (how many failed for good, whether any row will be retried)."""
    max_attempts = settings.CTXAPP.embedding_max_retries + 1
    reason = f"{type(exc).__name__}: {exc}"[:2000]
    give_up = [r.pk for r in rows if r.embedding_attempts + 1 >= max_attempts]
    retry = [r.pk for r in rows if r.embedding_attempts + 1 < max_attempts]
    Message.objects.filter(pk__in=give_up).update(
        embedding_status=MessageEmbeddingStatus.FAILED,
        embedding_attempts=max_attempts,
        embedding_error=f"gave up after {max_attempts} attempts: {reason}"[:2000],
    )
    Message.objects.filter(pk__in=retry).update(
        embedding_error=reason, embedding_attempts=F("embedding_attempts") + 1
    )
    return len(give_up), bool(retry)


def _failure_mark(rows: list[Message], exc: EmbedderError) -> int:
    """A permanent embedder error: the rows become `failed` with the reason. Returns how many."""
    reason = f"{type(exc).__name__}: {exc}"[:2000]
    failed = Message.objects.filter(pk__in=[r.pk for r in rows]).update(
        embedding_status=MessageEmbeddingStatus.FAILED, embedding_error=reason
    )
    logger.warning("memory index: %d messages failed to embed: %s", failed, reason)
    return failed


def _vectors_write(model_name: str, literals: dict[int, str]) -> None:
    """Store each message's vector (pgvector text form) and mark it completed, in one statement."""
    # One UPDATE … FROM unnest (bulk_update builds a CASE per field and row: 15% of a drain).
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Message._meta.db_table} m SET embedding = v.vector::vector, "
            "embedding_status = %s, embedding_model = %s, "
            "embedding_attempts = m.embedding_attempts + 1, embedding_error = '' "
            "FROM unnest(%s::bigint[], %s::text[]) AS v(id, vector) WHERE m.id = v.id",
            [MessageEmbeddingStatus.COMPLETED, model_name, list(literals), list(literals.values())],
        )


def memory_index_drain(*, time_budget: float | None = None, batch_size: int | None = None) -> DrainResult:
    """The drain job's body: embed pending messages batch by batch while full batches remain.

    Clears the dispatch flag first (so commits from now on queue the next job). Stops after
    `time_budget` seconds (CTXAPP_MEMORY_DRAIN_SECONDS) and then queues a successor if rows
    remain. After its first full batch it queues one more drain (unless one is queued), so a
    backlog is drained by as many drains as there are free worker slots (claims skip each other's
    rows). Idempotent; safe to run concurrently. Raises EmbedderUnavailable (the task retries).
    """
    MemoryIndexState.objects.filter(pk=1).update(drain_scheduled=False)
    budget = time_budget if time_budget is not None else settings.CTXAPP.memory_drain_seconds
    size = batch_size or settings.CTXAPP.memory_embed_batch
    result = DrainResult()
    started = time.monotonic()
    helper_asked = False
    while True:
        completed, failed, skipped = messages_embed_batch(batch_size=size)
        if completed:
            result.batches.append(completed)
        result.failed += failed
        result.skipped += skipped
        if completed + failed + skipped < size:
            return result
        if not helper_asked:
            helper_asked = True
            # A backlog: ask for one more drain (unless one is queued already), so an idle worker
            # slot, in this process or another, joins; each helper asks for the next the same
            # way. Without it one drain at a time ran however many workers there were.
            memory_index_dispatch()
        if time.monotonic() - started >= budget:
            result.handed_over = memory_index_dispatch(force=True)
            return result


def memory_index_sweep(*, older_than: timedelta | None = None) -> int:
    """Re-dispatch a drain job if messages have been pending longer than `older_than`.

    The recovery path for a dispatch lost after a commit or a job lost with its worker. Returns
    how many stale rows there were. Never raises on a dispatch failure (it logs).
    """
    seconds = settings.CTXAPP.memory_index_stale_seconds
    cutoff = timezone.now() - (older_than if older_than is not None else timedelta(seconds=seconds))
    stale = Message.objects.filter(embedding_status=MessageEmbeddingStatus.PENDING, created_at__lt=cutoff)
    count = stale.count()
    if count:
        logger.info("memory index sweep: %d messages pending too long; dispatching a drain", count)
        memory_index_dispatch(force=True)
    return count


def messages_reembed(
    *, tenant: Tenant | None = None, only_failed: bool = False, batch_size: int | None = None
) -> DrainResult:
    """Put messages (of `tenant`, or all; all or only failed) back to pending and embed them here.

    Used by `manage.py reembed --messages` after a model change. Rows of tenants with
    embedding off stay skipped.
    """
    queryset = Message.objects.exclude(embedding_status=MessageEmbeddingStatus.SKIPPED)
    if tenant is not None:
        queryset = queryset.filter(tenant=tenant)
    if only_failed:
        queryset = queryset.filter(embedding_status=MessageEmbeddingStatus.FAILED)
    queryset.update(embedding_status=MessageEmbeddingStatus.PENDING, embedding_attempts=0, embedding_error="")
    result = memory_index_drain(time_budget=float("inf"), batch_size=batch_size)
    # The same model leaves every search corpus's version as it was: tell the other processes.
    content_generation_bump(tenant=tenant)
    return result


def memory_index_status(*, tenant: Tenant) -> dict[str, int]:
    """Messages of the tenant per embedding status. Read-only."""
    counts = dict.fromkeys(MessageEmbeddingStatus.values, 0)
    for row in Message.objects.filter(tenant=tenant).values("embedding_status").annotate(n=Count("pk")):
        counts[row["embedding_status"]] = row["n"]
    return counts
