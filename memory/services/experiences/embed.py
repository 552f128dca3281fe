"""Embedding experiences: the job body, failures, retries and lost jobs.

A written vector makes the row findable by similarity and reconciles it with its neighbours
(merge / supersede, see `reconcile`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from memory.exceptions import NotFound
from memory.models import EmbeddingStatus, Experience, ExperiencePolicy, JobIntent, JobStatus, Tenant
from memory.services import jobs, recorder
from memory.services.agent_access import rows_visible
from memory.services.embedding import CacheKey, text_hash, vector_text, vectors_cached
from memory.services.experiences.queue import embedding_enqueue
from memory.services.experiences.reconcile import RECONCILE_CANDIDATE_FLOOR, nearest_similarities, reconcile
from memory.services.experiences.records import event_payload

logger = logging.getLogger(__name__)


def experiences_embed(*, experience_ids: list[int]) -> int:
    """Embed the still-pending experiences among `experience_ids`; return how many were completed.

    Idempotent: rows no longer pending are skipped, and rows are re-checked and written under
    `SELECT … FOR UPDATE` in one transaction, so a redelivered job (the worker died after
    embedding but before the ack) or a concurrent duplicate never writes a row twice: it waits
    for the other and then finds the row completed. (It waits rather than skipping a row another
    transaction holds, such as a neighbour's reconciliation: a skipped row was left pending with
    its job done, and nothing embedded it again.) A row whose text changed since it was read is
    queued again.
    Each written row gets `embedding_attempts + 1`, `embedded_at`, an `experience.embedded`
    event, and is then merged / superseded against its neighbours. Raises EmbedderUnavailable
    (transient, the job retries) or EmbedderError (permanent).

    Batch-shaped: the whole texts and the problems are embedded in one model
    call, every vector is written by one `UPDATE … FROM unnest`, the events by one INSERT per
    stream, and one query finds every row's nearest stored neighbour; only a row with a neighbour
    close enough to merge or supersede (`reconcile.RECONCILE_CANDIDATE_FLOOR`) runs `reconcile`.
    """
    rows = _pending(experience_ids)
    if not rows:
        return 0
    texts = {(row.tenant_id, row.text_hash): row.text for row in rows}
    texts.update({(row.tenant_id, text_hash(row.problem_text)): row.problem_text for row in rows})
    model_name, vectors = vectors_cached(texts)
    with transaction.atomic():
        _streams_lock(rows)
        pending = list(
            Experience.objects.select_for_update(of=("self",))
            .filter(pk__in=[row.pk for row in rows], embedding_status=EmbeddingStatus.PENDING)
            .select_related("tenant", "source_task", "source_session__agent")
            .order_by("created_at", "pk")  # one order for every run: they wait, never deadlock
        )
        locked = [e for e in pending if (e.tenant_id, e.text_hash) in vectors]
        embedding_enqueue([e.pk for e in pending if (e.tenant_id, e.text_hash) not in vectors])
        if not locked:
            return 0
        _vectors_write(locked, vectors=vectors, model_name=model_name)
        _embedded_events(locked, model_name=model_name)
        _reconcile_batch(locked)
    return len(locked)


def _pending(experience_ids: list[int]) -> list[Experience]:
    """The still-pending rows among `experience_ids`, unlocked, with what their texts and their
    events' streams need."""
    return list(
        Experience.objects.filter(pk__in=experience_ids, embedding_status=EmbeddingStatus.PENDING)
        .select_related("tenant", "source_session__agent")
        .only(
            "pk", "problem", "cause", "solution", "text_hash", "tenant__id",
            "source_session__id", "source_session__agent__external_id",
        )
    )  # fmt: skip


def _streams_lock(rows: list[Experience]) -> None:
    """Lock the streams the rows' events go to (each row's source session's agent, else its
    tenant's) before any row: recorder.streams_lock's rule. A distillation holds its agent's
    stream while it locks a stored experience it repeats; this job locked that experience first
    and then waited for the stream."""
    by_tenant: dict[int, list[Experience]] = {}
    for row in rows:
        by_tenant.setdefault(row.tenant_id, []).append(row)
    for tenant_id in sorted(by_tenant):
        of_tenant = by_tenant[tenant_id]
        recorder.streams_lock(tenant=of_tenant[0].tenant, sessions=[row.source_session for row in of_tenant])


def _vectors_write(rows: list[Experience], *, vectors: dict[CacheKey, np.ndarray], model_name: str) -> None:
    """Write every row's vectors and `completed` status in one statement (and on the objects)."""
    now = timezone.now()
    for experience in rows:
        vector = vectors[(experience.tenant_id, experience.text_hash)]
        experience.embedding = vector
        experience.problem_embedding = vectors[(experience.tenant_id, text_hash(experience.problem_text))]
        experience.embedding_model = model_name
        experience.embedding_dimensions = len(vector)
        experience.embedding_status = EmbeddingStatus.COMPLETED
        experience.embedding_error = ""
        experience.embedding_attempts += 1
        experience.embedded_at = now
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Experience._meta.db_table} AS e
            SET embedding = u.v::vector, problem_embedding = u.p::vector, embedding_model = %s,
                embedding_dimensions = u.d, embedding_status = %s, embedding_error = '',
                embedding_attempts = u.a, embedded_at = %s
            FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::int[], %s::int[]) AS u(id, v, p, d, a)
            WHERE e.id = u.id
            """,
            [
                model_name, EmbeddingStatus.COMPLETED, now, [r.pk for r in rows],
                [vector_text(vectors[(r.tenant_id, r.text_hash)]) for r in rows],
                [vector_text(vectors[(r.tenant_id, text_hash(r.problem_text))]) for r in rows],
                [r.embedding_dimensions for r in rows], [r.embedding_attempts for r in rows],
            ],
        )  # fmt: skip


def _embedded_events(rows: list[Experience], *, model_name: str) -> None:
    """One `experience.embedded` event per row, appended per stream (tenant, session) in one go."""
    streams: dict[tuple[int, int | None], list[Experience]] = {}
    for experience in rows:
        streams.setdefault((experience.tenant_id, experience.source_session_id), []).append(experience)
    for items in streams.values():
        recorder.events_append(
            tenant=items[0].tenant,
            session=items[0].source_session,
            entries=[
                ("experience.embedded", event_payload(e, model=model_name, dimensions=e.embedding_dimensions))
                for e in items
            ],
        )


def _reconcile_batch(rows: list[Experience]) -> None:
    """Merge / supersede each row against its neighbours, in order, as if embedded one by one.

    A row sees the stored rows and the rows before it in this batch (never the later ones, not
    yet reconciled). Its closest candidate is found for all rows at once (`nearest_similarities`);
    a row whose closest is below RECONCILE_CANDIDATE_FLOOR cannot merge or supersede (and what
    `reconcile` does only hides rows, never adds a candidate), so only the others run it.
    """
    closest = nearest_similarities(rows)
    policies: dict[int, ExperiencePolicy] = {}
    for position, experience in enumerate(rows):
        if closest[position] < RECONCILE_CANDIDATE_FLOOR:
            continue
        policy = policies.get(experience.tenant_id)
        if policy is None:
            policy = policies[experience.tenant_id] = ExperiencePolicy.for_tenant(experience.tenant)
        reconcile(experience=experience, policy=policy, exclude=[r.pk for r in rows[position + 1 :]])


def experiences_mark_failed(*, experience_ids: list[int], reason: str) -> int:
    """Mark the still-pending experiences among `experience_ids` failed with `reason`. Idempotent."""
    reason = reason[:2000]
    with transaction.atomic():
        _streams_lock(_pending(experience_ids))
        rows = list(
            Experience.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=experience_ids, embedding_status=EmbeddingStatus.PENDING)
            .select_related("tenant", "source_task", "source_session")
        )
        for experience in rows:
            experience.embedding_status = EmbeddingStatus.FAILED
            experience.embedding_error = reason
            experience.save(update_fields=["embedding_status", "embedding_error"])
            recorder.event_append(
                tenant=experience.tenant,
                type="experience.embedding_failed",
                session=experience.source_session,
                payload=event_payload(experience, reason=reason),
            )
    if rows:
        logger.warning("embedding failed for %d experiences: %s", len(rows), reason)
    return len(rows)


def experiences_retry_failed(
    *, tenant: Tenant | None = None, experience_ids: list[str] | None = None, bound_agent: str | None = None
) -> int:
    """Put failed experiences (of `tenant`, or all) back to pending and queue their embedding.

    Idempotent; returns how many were re-queued (named ones that are not failed are left alone).
    With `tenant`, a named id that is not one of its experiences the caller may see (`bound_agent`:
    agent_access.rows_visible) raises NotFound, nothing re-queued. Records
    `experience.embedding_retried` per tenant.
    """
    with transaction.atomic():
        queryset = Experience.objects.select_for_update().filter(embedding_status=EmbeddingStatus.FAILED)
        if tenant is not None:
            visible = Experience.objects.filter(tenant=tenant).filter(
                rows_visible(tenant=tenant, agent=bound_agent or "", kind="experience")
            )
            queryset = queryset.filter(pk__in=visible.values("pk"))
            if experience_ids is not None:
                known = set(visible.filter(public_id__in=experience_ids).values_list("public_id", flat=True))
                missing = [e for e in experience_ids if e not in known]
                if missing:
                    raise NotFound.of("experience", missing[0])
        if experience_ids is not None:
            queryset = queryset.filter(public_id__in=experience_ids)
        rows = list(queryset.select_related("tenant").order_by("pk"))
        by_tenant: dict[int, list[Experience]] = {}
        for row in rows:
            by_tenant.setdefault(row.tenant_id, []).append(row)
        Experience.objects.filter(pk__in=[r.pk for r in rows]).update(
            embedding_status=EmbeddingStatus.PENDING, embedding_error=""
        )
        for items in by_tenant.values():
            recorder.event_append(
                tenant=items[0].tenant,
                type="experience.embedding_retried",
                payload={"experiences": [r.public_id for r in items[:100]], "count": len(items)},
            )
        embedding_enqueue([r.pk for r in rows])
    return len(rows)


def experiences_requeue_stale(*, older_than: timedelta | None = None) -> int:
    """Re-queue embedding of experiences pending for longer than `older_than` (a lost job).

    Safe to run at any time: the embedding job skips rows that are no longer pending.
    """
    minutes = settings.CTXAPP.embedding_stale_minutes
    cutoff = timezone.now() - (older_than if older_than is not None else timedelta(minutes=minutes))
    ids = list(
        Experience.objects.filter(embedding_status=EmbeddingStatus.PENDING, created_at__lt=cutoff)
        .order_by("pk")
        .values_list("pk", flat=True)[:10_000]
    )
    # Rows an open job intent already holds (waiting, running, or backing off) are not lost.
    held: set[int] = set()
    for payload in JobIntent.objects.filter(
        kind=jobs.EMBED, status__in=[JobStatus.PENDING, JobStatus.RUNNING]
    ).values_list("payload", flat=True):
        held.update(int(i) for i in (payload or {}).get("ids", []))
    ids = [i for i in ids if i not in held]
    with transaction.atomic():
        embedding_enqueue(ids)
    return len(ids)
