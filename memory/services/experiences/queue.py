"""Queueing the embedding of new experiences: one coalesced job intent per transaction and batch."""

from __future__ import annotations

import secrets
import threading

from django.conf import settings
from django.db import transaction

from memory.services import jobs

_local = threading.local()


def embedding_enqueue(ids: list[int]) -> None:
    """Record the embedding job of `ids` in the current transaction (memory.services.jobs).

    Coalesced: all experiences written in one transaction share one job intent per batch
    (CTXAPP_EMBEDDING_BATCH_SIZE), and a worker taking one intent also takes other pending
    ones up to a batch, so 42 single-row writes cost a few jobs, not 42. The job is
    dispatched after commit; a broker that is down never fails the write.
    """
    if not ids:
        return
    with transaction.atomic():
        connection_ = transaction.get_connection()
        batch = settings.CTXAPP.embedding_batch_size
        open_intent: tuple[int, list[int]] | None = getattr(_local, "embed_intent", None)
        # Our intent belongs to this transaction only while its dispatch callback is registered
        # (after a commit or a rollback the callback list is cleared): otherwise start a new one.
        if open_intent is not None and not any(
            entry[1] is _embed_marker for entry in connection_.run_on_commit
        ):
            open_intent = None
        while ids:
            if open_intent is None or len(open_intent[1]) >= batch:
                chunk, ids = ids[:batch], ids[batch:]
                intent_id = jobs.job_enqueue(
                    tenant=None, kind=jobs.EMBED, key=f"tx-{secrets.token_hex(8)}", payload={"ids": chunk}
                )
                assert intent_id is not None  # a fresh key never coalesces
                open_intent = _local.embed_intent = (intent_id, list(chunk))
                if not any(entry[1] is _embed_marker for entry in connection_.run_on_commit):
                    transaction.on_commit(_embed_marker)
            else:
                room = batch - len(open_intent[1])
                merged = [*open_intent[1], *ids[:room]]
                if jobs.job_intent_update_payload(intent_id=open_intent[0], payload={"ids": merged}):
                    open_intent[1][:] = merged
                    ids = ids[room:]
                else:  # no longer pending (taken meanwhile): a new intent for the rest
                    open_intent = None


def _embed_marker() -> None:
    """Marks, in the connection's on-commit list, that this transaction has an open embedding intent."""
    _local.embed_intent = None
