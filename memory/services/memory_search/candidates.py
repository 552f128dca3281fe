"""The candidates of one search: the scope's messages (from the cached corpus, or for a very large
scope from PostgreSQL's HNSW and full-text indexes) and its summaries, facts and experiences."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from cachetools import TTLCache
from django.db import connection
from django.db.models import Q
from pgvector.django import CosineDistance

from memory.models import Message, Session, Summary, Tenant, TrackedFact
from memory.models.experiences import Experience, ExperienceScope
from memory.services import ranking
from memory.services.embedding import cosines_cached
from memory.services.experiences import visible_filter
from memory.services.memory_digest import digest_candidates
from memory.services.memory_search.corpus import exact_message_candidates, scope_corpus
from memory.services.memory_search.scope import SearchScope
from memory.services.memory_search.sql import (
    MessageCandidate,
    ScopeWhere,
    fetch_rows,
    scope_key,
    terms_or_query,
    vector_literal,
)
from memory.services.retrieval import _configure_hnsw

OTHER_KIND_POOL = 50  # summaries / facts / experiences per source


LARGE_TERM_CAP = 5_000  # large scopes: a term matching more rows than this counts as common
LARGE_STATS_SECONDS = 300.0  # large scopes: rows and mean length are re-measured this often
# Per process, re-measured every LARGE_STATS_SECONDS; a lock because a TTL cache mutates on reads.
_large_stats: TTLCache[tuple[Any, ...], tuple[int, float]] = TTLCache(
    maxsize=1024, ttl=LARGE_STATS_SECONDS, timer=time.monotonic
)
_large_term_counts: TTLCache[tuple[Any, ...], int | None] = TTLCache(
    maxsize=50_000, ttl=LARGE_STATS_SECONDS, timer=time.monotonic
)
_stats_lock = threading.Lock()


def _term_counts(*, where: ScopeWhere, terms: list[str], config: str) -> dict[str, int | None]:
    """Rows matching each term, counted through the GIN index up to LARGE_TERM_CAP (None: more,
    or a word PostgreSQL's configuration ignores). Re-counted every LARGE_STATS_SECONDS, like the
    scope's size: a common word costs a scan of up to 5,001 rows. At most one query."""
    key = (*scope_key(where), config)
    with _stats_lock:
        fresh = {t: _large_term_counts[(*key, t)] for t in terms if (*key, t) in _large_term_counts}
    missing = [t for t in terms if t not in fresh]
    if missing:
        counted = _term_counts_query(where=where, terms=missing, config=config)
        with _stats_lock:
            for term, count in counted.items():
                _large_term_counts[(*key, term)] = count
        fresh.update(counted)
    return {term: fresh[term] for term in terms}


def _term_counts_query(*, where: ScopeWhere, terms: list[str], config: str) -> dict[str, int | None]:
    table = Message._meta.db_table
    selects, params = [], []
    for term in terms:
        selects.append(
            "CASE WHEN numnode(plainto_tsquery(%s::regconfig, %s)) = 0 THEN NULL ELSE "
            f"(SELECT count(*) FROM (SELECT 1 FROM {table} m WHERE {where.where} "
            "AND m.search_vector @@ plainto_tsquery(%s::regconfig, %s) LIMIT %s) capped) END"
        )
        params += [config, term, *where.params, config, term, LARGE_TERM_CAP + 1]
    # Under LIMIT 5001 the planner takes a sequential scan for a common word (it reads ~40,000
    # wide rows at 100k messages: 60-300 ms); the GIN bitmap finds the same rows 2-4x faster.
    # Plain SET, not SET LOCAL: LOCAL would outlive this query in a caller's transaction.
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            cursor.execute(f"SELECT {', '.join(selects)}", params)
        except Exception:
            if not connection.in_atomic_block:  # else the rollback undoes the SET
                cursor.execute("RESET enable_seqscan")
            raise
        row = cursor.fetchone()
        cursor.execute("RESET enable_seqscan")
    return {
        term: (None if value is None or value > LARGE_TERM_CAP else int(value))
        for term, value in zip(terms, row, strict=True)
    }


def _corpus_stats(*, where: ScopeWhere, counts: dict[str, int | None]) -> ranking.CorpusStats:
    """Statistics of a large scope: rows and mean lexeme count (re-measured every 5 minutes), the
    exact document frequency of its rarer terms; common terms are counted in the pool (ranking)."""
    key = scope_key(where)
    with _stats_lock:
        cached = _large_stats.get(key)
    if cached is None:
        table = Message._meta.db_table
        row = fetch_rows(
            f"SELECT count(*), coalesce(avg(length(m.search_vector)), 0) FROM {table} m WHERE {where.where}",
            where.params,
        )[0]
        cached = (int(row[0]), float(row[1]))
        with _stats_lock:
            _large_stats[key] = cached
    df = {term: count for term, count in counts.items() if count is not None}
    return ranking.CorpusStats(n_docs=cached[0], avg_len=cached[1], df=df)


def _message_candidates(
    *,
    where: ScopeWhere,
    query: str,
    vector: np.ndarray | None,
    config: str,
    plan: ranking.Plan,
    counts: dict[str, int | None],
) -> list[ranking.Candidate]:
    table = Message._meta.db_table
    sessions_table = Session._meta.db_table
    dense_ids: list[int] = []
    if vector is not None:
        _configure_hnsw()
        dense_ids = [
            r[0]
            for r in fetch_rows(
                f"SELECT m.id FROM {table} m WHERE {where.where} AND m.embedding IS NOT NULL "
                f"ORDER BY m.embedding <=> %s::vector LIMIT %s",
                [*where.params, vector_literal(vector), ranking.POOL_DENSE],
            )
        ]
    lexical_ids: list[int] = []
    # Rank only rows matching the rarer terms (or, if every term is common, all of them): an OR
    # of common words would make PostgreSQL rank most of a large scope.
    rare = [term for term, count in counts.items() if count]
    or_query = " | ".join(rare) if rare else " & ".join(t for t, c in counts.items() if c is None)
    if or_query:
        lexical_ids = [
            r[0]
            for r in fetch_rows(
                f"SELECT m.id FROM {table} m, to_tsquery(%s::regconfig, %s) q "
                f"WHERE {where.where} AND m.search_vector @@ q "
                f"ORDER BY ts_rank_cd(m.search_vector, q) DESC, m.id LIMIT %s",
                [config, or_query, *where.params, ranking.POOL_LEXICAL],
            )
        ]
    ids = list(dict.fromkeys(dense_ids + lexical_ids))
    if not ids:
        return []
    seeds = list(
        dict.fromkeys(dense_ids[: ranking.POOL_NEIGHBOUR_SEEDS] + lexical_ids[: ranking.POOL_NEIGHBOUR_SEEDS])
    )
    radius = plan.neighbour_radius if plan.neighbour_weight > 0 else 0
    cosine = "1 - (m.embedding <=> %s::vector)" if vector is not None else "NULL::float8"
    cosine_params = [vector_literal(vector)] if vector is not None else []
    # Neighbours by the (session, seq) index, one nested-loop probe per seed: an EXISTS in the
    # WHERE clause would be evaluated for every row of the scope.
    chosen = "SELECT unnest(%s::bigint[])"
    params: list[Any] = [ids]
    if radius and seeds:
        chosen += (
            f" UNION SELECT near.id FROM {table} seed JOIN {table} near ON near.session_id = seed.session_id "
            "AND near.seq BETWEEN seed.seq - %s AND seed.seq + %s WHERE seed.id = ANY(%s::bigint[])"
        )
        params += [radius, radius, seeds]
    rows = fetch_rows(
        f"SELECT m.id, s.public_id, m.seq, m.name, m.content, m.occurred_at, {cosine} "
        f"FROM {table} m JOIN {sessions_table} s ON s.id = m.session_id "
        f"WHERE {where.where} AND m.id IN ({chosen})",
        [*cosine_params, *where.params, *params],
    )
    return [
        MessageCandidate(
            key=f"message:{pk}",
            kind="message",
            text=ranking.index_text(content=content, speaker=name or None, occurred_at=occurred_at),
            group=session_public_id,
            position=int(seq),
            occurred_at=occurred_at,
            dense=None if cos is None else float(cos),
            speaker=name,
            content=content,
        )
        for pk, session_public_id, seq, name, content, occurred_at, cos in rows
    ]


def _text_rows_matching(queryset: Any, *, text_sql: str, query: str, config: str, limit: int) -> Any:
    """Rows of `queryset` whose text matches any query term (full text computed on the fly)."""
    or_query = terms_or_query(query)
    if not or_query:
        return queryset.none()
    return queryset.extra(
        where=[f"to_tsvector(%s::regconfig, {text_sql}) @@ to_tsquery(%s::regconfig, %s)"],
        params=[config, config, or_query],
    )[:limit]


@dataclass(frozen=True)
class _KindQuery:
    """What a search asks of summaries, facts and experiences."""

    tenant: Tenant
    session_pks: list[int] | None
    scope: SearchScope
    query: str
    vector: np.ndarray | None
    config: str
    time_from: datetime | None
    time_to: datetime | None

    def in_time(self, queryset: Any, field_name: str) -> Any:
        if self.time_from is not None:
            queryset = queryset.filter(**{f"{field_name}__gte": self.time_from})
        if self.time_to is not None:
            queryset = queryset.filter(**{f"{field_name}__lte": self.time_to})
        return queryset

    def in_scope(self, queryset: Any) -> Any:
        return queryset if self.session_pks is None else queryset.filter(session_id__in=self.session_pks)


def _row_candidates(
    kind: str,
    rows: list[Any],
    *,
    texts: list[str],
    vector: np.ndarray | None,
    embedded: list[str] | None = None,
) -> list[ranking.Candidate]:
    """Candidates of one kind from its rows; the dense signal is the query's cosine to `embedded`
    (default: the texts)."""
    cosines = cosines_cached(vector, texts if embedded is None else embedded)
    return [
        ranking.Candidate(
            key=f"{kind}:{row.public_id}",
            kind=kind,
            text=text,
            group=None,
            position=None,
            occurred_at=row.created_at,
            dense=cos,
        )
        for row, text, cos in zip(rows, texts, cosines, strict=True)
    ]


def _summary_candidates(q: _KindQuery) -> list[ranking.Candidate]:
    """The scope's current summaries that match a query term, then its sessions' digests."""
    summaries = q.in_scope(
        q.in_time(
            Summary.objects.filter(tenant=q.tenant, is_current=True).select_related("session"), "created_at"
        )
    )
    rows = list(
        _text_rows_matching(summaries, text_sql="text", query=q.query, config=q.config, limit=OTHER_KIND_POOL)
    )
    candidates = _row_candidates("summary", rows, texts=[r.text for r in rows], vector=q.vector)
    # The sessions' digests (medium-term memory) are summaries too.
    return candidates + digest_candidates(
        tenant=q.tenant, query=q.query, session_pks=q.session_pks, vector=q.vector,
        time_from=q.time_from, time_to=q.time_to, limit=OTHER_KIND_POOL,
    )  # fmt: skip


def _fact_candidates(q: _KindQuery) -> list[ranking.Candidate]:
    """The scope's tracked facts whose key or content matches a query term."""
    facts = q.in_scope(
        q.in_time(TrackedFact.objects.filter(tenant=q.tenant).select_related("session"), "created_at")
    )
    rows = list(
        _text_rows_matching(
            facts, text_sql="(key || ' ' || content)", query=q.query, config=q.config, limit=OTHER_KIND_POOL
        )
    )
    texts = [f"{r.key}: {r.content}" for r in rows]
    return _row_candidates("fact", rows, texts=texts, embedded=[r.content for r in rows], vector=q.vector)


def _experience_candidates(q: _KindQuery) -> list[ranking.Candidate]:
    """The tenant's shared experiences and the scope user's own: the nearest by vector, then
    those matching a query term (english full text, as experiences search)."""
    visible = Q(scope=ExperienceScope.TENANT)
    if q.scope.user_id:
        visible |= Q(user_id=q.scope.user_id)
    experiences = q.in_time(
        Experience.objects.filter(tenant=q.tenant).filter(visible_filter()).filter(visible), "created_at"
    ).defer("embedding", "problem_embedding", "search_vector")
    found: dict[int, Experience] = {}
    if q.vector is not None:
        _configure_hnsw()
        nearest = experiences.exclude(embedding=None).order_by(CosineDistance("embedding", q.vector))
        for row in nearest[:OTHER_KIND_POOL]:
            found[row.pk] = row
    or_query = terms_or_query(q.query)
    if or_query:
        for row in experiences.extra(
            where=["search_vector @@ to_tsquery(%s::regconfig, %s)"], params=["english", or_query]
        )[:OTHER_KIND_POOL]:
            found.setdefault(row.pk, row)
    rows = list(found.values())
    return _row_candidates("experience", rows, texts=[r.text for r in rows], vector=q.vector)


def other_candidates(
    *,
    tenant: Tenant,
    kinds: set[str],
    session_pks: list[int] | None,
    scope: SearchScope,
    query: str,
    vector: np.ndarray | None,
    config: str,
    time_from: datetime | None,
    time_to: datetime | None,
) -> list[ranking.Candidate]:
    """Summaries, facts and experiences of the scope among `kinds`, in that order."""
    q = _KindQuery(
        tenant=tenant, session_pks=session_pks, scope=scope, query=query, vector=vector, config=config,
        time_from=time_from, time_to=time_to,
    )  # fmt: skip
    candidates: list[ranking.Candidate] = []
    for kind, step in (
        ("summary", _summary_candidates),
        ("fact", _fact_candidates),
        ("experience", _experience_candidates),
    ):
        if kind in kinds:
            candidates += step(q)
    return candidates


def scope_message_candidates(
    *, where: ScopeWhere, query: str, vector: np.ndarray | None, config: str, plan: ranking.Plan
) -> tuple[list[ranking.Candidate], ranking.CorpusStats]:
    """The scope's message pool and its BM25 statistics: exact from the cached scope, or (a very
    large scope) approximated by PostgreSQL's full text."""
    corpus = scope_corpus(where)
    if corpus is not None:
        found, stats = exact_message_candidates(
            corpus=corpus, where=where, query=query, vector=vector, plan=plan
        )
        return list(found), stats
    terms = list(dict.fromkeys(ranking.tokenize(query)))
    counts = _term_counts(where=where, terms=terms, config=config)
    found = _message_candidates(
        where=where, query=query, vector=vector, config=config, plan=plan, counts=counts
    )
    return list(found), _corpus_stats(where=where, counts=counts)
