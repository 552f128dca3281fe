"""Queueing the embedding of new experiences: one coalesced job intent per transaction and batch."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import transaction

from ctxapp.infra.commit_batch import CommitBatch
from memory.services import jobs

# This transaction's embedding intents, as (intent id, its ids) after each write to it: the last
# is the open one. Nothing to flush (jobs.job_enqueue dispatches each intent after commit); the
# batch forgets them at commit and, with the payload writes they stand for, at a rollback.
_intents: CommitBatch[tuple[int, list[int]]] = CommitBatch(None)


def embedding_enqueue(ids: list[int]) -> None:
    """Record the embedding job of `ids` in the current transaction (memory.services.jobs).

    Coalesced: all experiences written in one transaction share one job intent per batch
    (CTXAPP_EMBEDDING_BATCH_SIZE), and a worker taking one intent also takes other pending
    ones up to a batch, so 42 single-row writes cost a few jobs, not 42. The job is
    dispatched after commit; a broker that is down never fails the write.
    """
    if not ids:
        return
    batch = settings.CTXAPP.embedding_batch_size
    with transaction.atomic():
        written = _intents.pending()
        intent = written[-1] if written else None
        while ids:
            if intent is not None and len(intent[1]) < batch:
                merged = [*intent[1], *ids[: batch - len(intent[1])]]
                if jobs.job_intent_update_payload(intent_id=intent[0], payload={"ids": merged}):
                    ids = ids[len(merged) - len(intent[1]) :]
                    intent = (intent[0], merged)
                    _intents.add(intent)
                    continue
            # None open yet, the open one full, or taken by a worker meanwhile: a new intent.
            chunk, ids = ids[:batch], ids[batch:]
            intent_id = jobs.job_enqueue(
                tenant=None, kind=jobs.EMBED, key=f"tx-{secrets.token_hex(8)}", payload={"ids": chunk}
            )
            assert intent_id is not None  # a fresh key never coalesces
            intent = (intent_id, chunk)
            _intents.add(intent)
