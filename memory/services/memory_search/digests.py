"""Session digests (medium-term memory, memory/services/session_digest.py) as memory search candidates.

`digest_candidates` returns, for a memory search, the latest digest version of each session in the
search's scope whose text matches any of the query's terms, as `ranking.Candidate`s of kind
`summary` (a digest is a structured summary of its session: goals, decisions, findings,
preferences, constraints, progress, open questions). Their dense signal is the cosine of the
digest text to the query, through the shared EmbeddingCache (each text embedded once, ever), like
summaries and facts in memory_search.py. Read-only.

The hit id (the key after `summary:`) is `<session id>/digest/v<version>`: it names the session
and the version, so a client can open the digest (`GET /sessions/{id}/digest`).
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
from django.db.models import F, OuterRef, Subquery

from memory.models import Tenant
from memory.models.digest import SessionDigest
from memory.services import ranking
from memory.services.embedding import cosines_cached

DIGEST_POOL = 50  # digests per search, at most


def digest_id(*, session_id: str, version: int) -> str:
    """A digest's id in search results: `<session id>/digest/v<version>`."""
    return f"{session_id}/digest/v{version}"


def digest_candidates(
    *,
    tenant: Tenant,
    query: str,
    session_pks: list[int] | None,
    vector: np.ndarray | None = None,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    limit: int = DIGEST_POOL,
) -> list[ranking.Candidate]:
    """The latest digest of each scope session matching `query`, as memory search candidates.

    `session_pks` are the scope's session pks as memory_search.scope_sessions returns them (None:
    the whole tenant; []: nothing). A digest matches when its text (the generated English
    tsvector, GIN-indexed) holds any of the query's terms; only each session's latest version is
    considered, filtered by the tenant always and by its created_at against the time range.
    `vector` is the query's embedding (None: no dense signal). Best lexical match first, at most
    `limit`. Read-only.
    """
    if session_pks == []:
        return []
    terms = list(dict.fromkeys(ranking.tokenize(query)))
    if not terms:
        return []
    latest = (
        SessionDigest.objects.filter(session=OuterRef("session")).order_by("-version").values("version")[:1]
    )
    queryset = SessionDigest.objects.filter(tenant=tenant, version=Subquery(latest)).exclude(text="")
    if session_pks is not None:
        queryset = queryset.filter(session_id__in=session_pks)
    if time_from is not None:
        queryset = queryset.filter(created_at__gte=time_from)
    if time_to is not None:
        queryset = queryset.filter(created_at__lte=time_to)
    tsquery = " | ".join(terms)  # [a-z0-9]+ terms: nothing to escape
    rows = list(
        queryset.extra(
            select={"rank": "ts_rank_cd(search_vector, to_tsquery('english'::regconfig, %s))"},
            select_params=[tsquery],
            where=["search_vector @@ to_tsquery('english'::regconfig, %s)"],
            params=[tsquery],
        )
        .annotate(session_public_id=F("session__public_id"))
        .order_by("-rank", "-created_at")
        .values("session_public_id", "version", "text", "created_at")[:limit]
    )
    cosines = cosines_cached(vector, [row["text"] for row in rows], tenant_id=tenant.pk)
    return [
        ranking.Candidate(
            key=f"summary:{digest_id(session_id=row['session_public_id'], version=row['version'])}",
            kind="summary",
            text=row["text"],
            group=None,
            position=None,
            occurred_at=row["created_at"],
            dense=cos,
        )
        for row, cos in zip(rows, cosines, strict=True)
    ]
