"""Embedding user memories: one coalesced outbox job per tenant, run by a Celery worker.

Every new version of a memory is written `pending` and queues `user_memory.embed` for its tenant
in the same transaction (memory.services.jobs). The job key is the tenant, so while a job waits
untaken, further writes add nothing to the queue: the run embeds every pending memory of the
tenant (up to CTXAPP_EMBEDDING_BATCH_SIZE, then queues itself again). A memory written while a
run is under way finds that intent taken and queues a new one, so none is left pending.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from memory.models import EmbeddingStatus, Tenant, UserMemory
from memory.services import jobs, recorder
from memory.services.embedding import text_hash, vectors_cached

logger = logging.getLogger(__name__)


def _job_key(tenant_id: int) -> str:
    return f"tenant:{tenant_id}"


def embedding_enqueue(*, tenant: Tenant) -> None:
    """Queue the embedding of the tenant's pending memories, after the caller's transaction commits."""
    jobs.job_enqueue(tenant=tenant, kind=jobs.USER_MEMORY_EMBED, key=_job_key(tenant.pk), payload={})


def user_memories_embed(*, tenant_id: int) -> int:
    """Embed the tenant's pending user memories; return how many were written. Not atomic by itself:
    run inside the job runner's transaction.

    Idempotent: only `pending` rows are taken, under `FOR UPDATE SKIP LOCKED`, so a redelivered or
    concurrent run never writes a row twice. One embedder call for the batch (vectors come from the
    shared EmbeddingCache when known), one `user_memory.embedded` event with the ids. Raises
    EmbedderUnavailable (transient: the job retries) or EmbedderError.
    """
    batch = settings.CTXAPP.embedding_batch_size
    rows = list(
        UserMemory.objects.select_for_update(skip_locked=True)
        .filter(tenant_id=tenant_id, embedding_status=EmbeddingStatus.PENDING)
        .order_by("pk")
        .only("pk", "public_id", "text", "tenant_id")[: batch + 1]
    )
    if not rows:
        return 0
    more, rows = len(rows) > batch, rows[:batch]
    model_name, vectors = vectors_cached({(tenant_id, text_hash(row.text)): row.text for row in rows})
    for row in rows:
        row.embedding = vectors[(tenant_id, text_hash(row.text))]
        row.embedding_model = model_name
        row.embedding_status = EmbeddingStatus.COMPLETED
    UserMemory.objects.bulk_update(rows, ["embedding", "embedding_model", "embedding_status"])
    tenant = Tenant.objects.get(pk=tenant_id)
    recorder.event_append(
        tenant=tenant,
        type="user_memory.embedded",
        payload={"memories": [row.public_id for row in rows], "model": model_name},
    )
    if more:
        embedding_enqueue(tenant=tenant)
    return len(rows)


def user_memories_mark_failed(*, tenant_id: int, reason: str) -> int:
    """Mark the tenant's still-pending memories failed (the embedder refused them for good)."""
    with transaction.atomic():
        count = UserMemory.objects.filter(
            tenant_id=tenant_id, embedding_status=EmbeddingStatus.PENDING
        ).update(embedding_status=EmbeddingStatus.FAILED)
    if count:
        logger.warning("embedding failed for %d user memories: %s", count, reason[:500])
    return count
