"""Queueing the embedding of new experiences: one job intent per transaction and batch."""

from __future__ import annotations

from django.conf import settings
from django.db import connection, transaction

from memory.models import JobIntent, JobStatus
from memory.services import jobs


def embedding_enqueue(ids: list[int]) -> None:
    """Record the embedding job of `ids` in the current transaction (memory.services.jobs).

    Coalesced: the experiences one transaction writes share one job intent per batch
    (CTXAPP_EMBEDDING_BATCH_SIZE), found by the transaction's id, so 42 single-row writes cost a
    few jobs, not 42; and a worker taking one intent also takes other pending ones up to a batch.
    The job is dispatched after commit; a broker that is down never fails the write.
    """
    if not ids:
        return
    batch = settings.CTXAPP.embedding_batch_size
    with transaction.atomic(savepoint=False):
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_xact_id()::text")
            prefix = f"embed:{cursor.fetchone()[0]}:"
        # No worker can see this transaction's intents before it commits: the newest is still open.
        open_intent = (
            JobIntent.objects.filter(kind=jobs.EMBED, key__startswith=prefix, status=JobStatus.PENDING)
            .order_by("-pk")
            .first()
        )
        if open_intent is not None:
            held = list(open_intent.payload.get("ids", []))
            room = max(0, batch - len(held))
            if room:
                open_intent.payload = {"ids": [*held, *ids[:room]]}
                open_intent.save(update_fields=["payload"])
                ids = ids[room:]
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            jobs.job_enqueue(tenant=None, kind=jobs.EMBED, key=f"{prefix}{chunk[0]}", payload={"ids": chunk})
