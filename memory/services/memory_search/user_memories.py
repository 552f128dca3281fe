"""User memories (memory/models/user_memory.py) as memory search candidates, kind `user_memory`.

Which memories: those of the users whose sessions the scope covers (the whole tenant's when the
scope is the tenant), current ones only, or those current at `as_of`. A memory is a candidate
when its words match a query term (the generated tsvector, GIN) or its meaning is among the
nearest (pgvector HNSW over the stored embeddings). A memory whose embedding job has not run yet
is still found by meaning: the newest such memories of the scope are pooled too, and every
candidate's cosine falls back on the shared EmbeddingCache. Read-only.

The hit id is the memory's public id; `sources` ({session, seq} of the turns it was taken from)
ride along so that recall can bring those turns as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from django.db.models import FloatField, Q, Value
from pgvector.django import CosineDistance

from memory.models import Session, Tenant, UserMemory
from memory.services import ranking
from memory.services.embedding import cosines_cached
from memory.services.experience_search import AnyLexemeQuery, configure_hnsw

USER_MEMORY_POOL = 50  # per source: by words, by meaning, not yet embedded


@dataclass
class UserMemoryCandidate(ranking.Candidate):
    subject: str = ""
    sources: list[dict[str, Any]] = field(default_factory=list)


def scope_user_ids(*, tenant: Tenant, session_pks: list[int] | None) -> list[str] | None:
    """The users whose memories a scope covers: those of its sessions (None: every user of the tenant)."""
    if session_pks is None:
        return None
    rows = Session.objects.filter(tenant=tenant, pk__in=session_pks).exclude(user_id="")
    return sorted(set(rows.values_list("user_id", flat=True)))


def user_memory_candidates(
    *,
    tenant: Tenant,
    user_ids: list[str] | None,
    query: str,
    vector: np.ndarray | None,
    as_of: datetime | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    readable: Q | None = None,
) -> list[ranking.Candidate]:
    """The scope's user memories matching `query` by words or meaning (see the module doc), among
    the `readable` ones (a bound key's: agent_access.rows_visible)."""
    if user_ids == []:
        return []
    base = UserMemory.objects.filter(tenant=tenant)
    if readable is not None:
        base = base.filter(readable)
    if user_ids is not None:
        base = base.filter(user_id__in=user_ids)
    if as_of is None:
        base = base.filter(valid_to__isnull=True)
    else:
        base = base.filter(valid_from__lte=as_of).filter(Q(valid_to__isnull=True) | Q(valid_to__gt=as_of))
    if time_from is not None:
        base = base.filter(valid_from__gte=time_from)
    if time_to is not None:
        base = base.filter(valid_from__lte=time_to)
    columns = ("pk", "public_id", "subject", "text", "sources", "valid_from", "distance")
    # One statement (a UNION of the three pools): a search pays one round trip for this kind.
    if vector is not None:
        configure_hnsw()
        base = base.annotate(distance=CosineDistance("embedding", vector.tolist()))
    else:
        base = base.annotate(distance=Value(None, output_field=FloatField()))
    pools = []
    if ranking.tokenize(query):
        lexical = base.filter(search_vector=AnyLexemeQuery(query)).order_by("-valid_from")
        pools.append(lexical.values(*columns)[:USER_MEMORY_POOL])
    if vector is not None:
        nearest = base.filter(embedding__isnull=False).order_by("distance")
        pending = base.filter(embedding__isnull=True).order_by("-valid_from")
        pools += [nearest.values(*columns)[:USER_MEMORY_POOL], pending.values(*columns)[:USER_MEMORY_POOL]]
    if not pools:
        return []
    found = {row["pk"]: row for row in pools[0].union(*pools[1:])}
    rows = sorted(found.values(), key=lambda row: row["pk"])
    stored = {row["pk"]: 1.0 - float(row["distance"]) for row in rows if row["distance"] is not None}
    missing = [row["text"] for row in rows if row["pk"] not in stored]
    cached = dict(zip(missing, cosines_cached(vector, missing, tenant_id=tenant.pk), strict=True))
    return [
        UserMemoryCandidate(
            key=f"user_memory:{row['public_id']}",
            kind="user_memory",
            text=row["text"],
            group=None,
            position=None,
            occurred_at=row["valid_from"],
            dense=stored.get(row["pk"], cached.get(row["text"])),
            subject=row["subject"],
            sources=[s for s in row["sources"] or [] if isinstance(s, dict)],
        )
        for row in rows
    ]
