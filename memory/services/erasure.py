"""The steps every erasure shares (forget a user, redact a message, delete a session).

Events become tombstones (type, time, stream, seq and ids; no content) and the tenant's
embedding-cache rows of the erased texts go. Statements run on the caller's connection, inside its
transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.db.models import CharField, F, Func

from memory.models import (
    EmbeddingCache,
    Event,
    Experience,
    Tenant,
    UserMemory,
)
from memory.services.embedding import text_hash
from memory.services.message_indexing import embedding_text

TOMBSTONE_KEY = "erased"
# What a tombstoned event keeps of its payload: the ids the recorder adds (recorder.OTEL_FIELDS).
TOMBSTONE_KEEPS = ("gen_ai.agent.id", "gen_ai.conversation.id")


def sql_execute(sql: str, params: list[Any]) -> int:
    """Run one statement; the rows it changed."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return max(cursor.rowcount, 0)


def like_any(values: Iterable[str]) -> list[str]:
    """LIKE patterns finding each value anywhere in a text (its %, _ and \\ escaped)."""
    return ["%" + re.sub(r"([%_\\])", r"\\\1", v) + "%" for v in values if v]


def events_tombstone(*, tenant: Tenant, where: str, params: list[Any]) -> int:
    """Replace the payload of the tenant's matching events by a tombstone: the ids, no content."""
    keeps = ", ".join(f"'{key}', payload->'{key}'" for key in TOMBSTONE_KEEPS)
    return sql_execute(
        f"UPDATE {Event._meta.db_table} SET payload = "
        f"jsonb_strip_nulls(jsonb_build_object({keeps})) || jsonb_build_object('{TOMBSTONE_KEY}', true) "
        f"WHERE tenant_id = %s AND NOT (payload ? '{TOMBSTONE_KEY}') AND ({where})",
        [tenant.pk, *params],
    )


def message_text_hashes(messages: Any) -> set[str]:
    """The hashes of the texts a queryset of messages was embedded as (their cache keys)."""
    return {
        text_hash(embedding_text(name=name, content=content, occurred_at=occurred_at))
        for name, content, occurred_at in messages.values_list("name", "content", "occurred_at").iterator(
            chunk_size=5000
        )
    }


def cache_entries_delete(*, tenant: Tenant, hashes: set[str]) -> int:
    """Delete the tenant's EmbeddingCache rows of these text hashes, except those a remaining
    experience or user memory of the tenant still holds (their text is not erased; a message's own
    vector is on its row). The cache is per tenant: no other tenant's row is touched.

    A kept entry would let anyone holding a guess of the text confirm that it was once embedded."""
    if not hashes:
        return 0
    kept = set(
        Experience.objects.filter(tenant=tenant, text_hash__in=hashes).values_list("text_hash", flat=True)
    )
    # A memory's own text_hash is of its normalised text (store.py); its vector is cached under the
    # hash of the text as embedded.
    embedded_as = Func(
        F("text"),
        template="encode(sha256(convert_to(%(expressions)s, 'UTF8')), 'hex')",
        output_field=CharField(),
    )
    memories = UserMemory.objects.filter(tenant=tenant).annotate(embedded_as=embedded_as)
    kept |= set(memories.filter(embedded_as__in=hashes).values_list("embedded_as", flat=True))
    doomed = sorted(hashes - kept)
    if not doomed:
        return 0
    return EmbeddingCache.objects.filter(tenant=tenant, text_hash__in=doomed).delete()[0]
