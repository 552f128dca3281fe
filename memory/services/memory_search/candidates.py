"""The candidates of one search: the scope's messages (PostgreSQL's full-text and pgvector indexes,
one statement, the same for every scope size) and its summaries, facts, experiences and user
memories (only the kinds the scope holds rows of: `kinds_present`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory.models import Message, Session, Summary, Tenant, TrackedFact, UserMemory
from memory.models.digest import SessionDigest
from memory.models.experiences import Experience
from memory.services import ranking, sharing
from memory.services.agent_access import rows_visible
from memory.services.embedding import cosines_cached
from memory.services.experience_search import (
    DEFERRED,
    AnyLexemeQuery,
    configure_hnsw,
    experiences_visible,
    search_candidates,
)
from memory.services.memory_search.digests import digest_candidates
from memory.services.memory_search.scope import SearchScope
from memory.services.memory_search.sql import (
    MessageCandidate,
    ScopeWhere,
    fetch_rows,
    terms_or_query,
    vector_literal,
)
from memory.services.memory_search.user_memories import scope_user_ids, user_memory_candidates

OTHER_KIND_POOL = 50  # summaries / facts / experiences per source

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# The lexical pool ranks (ts_rank_cd) at most this many rows of each query word, the first the
# GIN index hands over: every row of a rare word, a bounded share of a common one (a name in 12 %
# of a large tenant), so a search visits at most this many rows per word. Capping the words'
# union instead (5,000 rows) cost a whole-tenant search at 100,000 messages 50 ms of PostgreSQL
# CPU (docs/benchmarks.md, bench_memory.py).
LEXICAL_ROWS_PER_WORD = 200

_EPOCH_SQL = "(extract(epoch FROM n.occurred_at) * 1000000)::bigint"


def message_pool(
    *, where: ScopeWhere, query: str, vector: np.ndarray | None, config: str, plan: ranking.Plan
) -> list[ranking.Candidate]:
    """The scope's message pool in one statement (ranking.py's contract; every scope size alike):
    the best POOL_LEXICAL rows by full text (an OR of the query's words over the GIN index,
    ts_rank_cd), the best POOL_DENSE by cosine (pgvector), the turns within ±POOL_NEIGHBOURS of
    the best POOL_NEIGHBOUR_SEEDS of each list; every candidate with its cosine, and for window
    BM25 the text of its neighbours within ±plan.window_radius (read in the same statement)."""
    words = terms_or_query(query)
    if not words and vector is None:
        return []
    table, sessions = Message._meta.db_table, Session._meta.db_table
    literal = vector_literal(vector) if vector is not None else None
    ctes, pools, seeds, params = [], [], [], []
    if words:
        ctes.append(
            f"lexical AS MATERIALIZED (SELECT m.id, m.session_id, m.seq, ts_rank_cd(m.search_vector, q) "
            f"AS rank FROM {table} m, to_tsquery(%s::regconfig, %s) q WHERE m.id IN (SELECT t.id FROM "
            f"unnest(%s::text[]) w(word), LATERAL (SELECT m.id FROM {table} m WHERE {where.where} "
            f"AND m.search_vector @@ to_tsquery(%s::regconfig, w.word) LIMIT {LEXICAL_ROWS_PER_WORD:d}) t) "
            f"ORDER BY rank DESC, m.id DESC LIMIT {ranking.POOL_LEXICAL:d})"
        )
        params += [config, words, words.split(" | "), *where.params, config]
        pools.append("SELECT id, session_id, seq FROM lexical")
        seeds.append(
            f"(SELECT session_id, seq FROM lexical ORDER BY rank DESC, id DESC "
            f"LIMIT {ranking.POOL_NEIGHBOUR_SEEDS:d})"
        )
    if literal is not None:
        ctes.append(
            f"dense AS MATERIALIZED (SELECT m.id, m.session_id, m.seq, m.embedding <=> %s::vector AS "
            f"distance FROM {table} m WHERE {where.where} AND m.embedding IS NOT NULL "
            f"ORDER BY m.embedding <=> %s::vector LIMIT {ranking.POOL_DENSE:d})"
        )
        params += [literal, *where.params, literal]
        pools.append("SELECT id, session_id, seq FROM dense")
        seeds.append(
            "(SELECT session_id, seq FROM dense ORDER BY distance, id "
            f"LIMIT {ranking.POOL_NEIGHBOUR_SEEDS:d})"
        )
    radius = ranking.POOL_NEIGHBOURS if plan.neighbour_weight > 0 else 0
    if radius:
        ctes.append(f"seeds AS ({' UNION '.join(seeds)})")
        pools.append(
            f"SELECT n.id, n.session_id, n.seq FROM seeds s JOIN {table} n ON n.session_id = s.session_id "
            f"AND n.seq BETWEEN s.seq - {radius:d} AND s.seq + {radius:d} WHERE {where.clause('n')}"
        )
        params += where.params
    ctes.append(f"pool AS MATERIALIZED ({' UNION '.join(pools)})")
    window = plan.window_radius if plan.lexical_weight > 0 else 0
    cosine = "1 - (n.embedding <=> %s::vector)" if literal is not None else "NULL::float8"
    # The pool's rows, and (window BM25) their neighbours' rows, each once; `p.id` says which.
    statement = (
        f"WITH {', '.join(ctes)}, rows AS (SELECT DISTINCT n.id, p.id IS NOT NULL AS candidate "
        f"FROM pool c JOIN {table} n ON n.session_id = c.session_id AND n.seq BETWEEN c.seq - {window:d} "
        f"AND c.seq + {window:d} LEFT JOIN pool p ON p.id = n.id) "
        f"SELECT n.id, s.public_id, n.seq, n.name, n.content, {_EPOCH_SQL}, {cosine}, r.candidate "
        f"FROM rows r JOIN {table} n ON n.id = r.id JOIN {sessions} s ON s.id = n.session_id"
    )
    if literal is not None:
        configure_hnsw()
        params.append(literal)
    rows = fetch_rows(statement, params)
    texts: dict[tuple[str, int], str] = {}
    found: list[MessageCandidate] = []
    for pk, session_public_id, seq, name, content, micros, cos, candidate in rows:
        occurred_at = _EPOCH + timedelta(microseconds=micros)
        text = ranking.index_text(content=content, speaker=name or None, occurred_at=occurred_at)
        texts[(session_public_id, int(seq))] = text
        if candidate:
            found.append(
                MessageCandidate(
                    key=f"message:{pk}", kind="message", text=text, group=session_public_id,
                    position=int(seq), occurred_at=occurred_at, dense=None if cos is None else float(cos),
                    speaker=name or "", content=content,
                )
            )  # fmt: skip
    found.sort(key=lambda c: (c.group or "", c.position or 0))  # a stable pool order
    if window:
        for c in found:
            assert c.group is not None and c.position is not None
            near = (texts.get((c.group, c.position + d)) for d in range(-window, window + 1) if d)
            c.window = ranking.window_text([t for t in near if t is not None])
    return list(found)


# Qualified: the facts are read with their session joined, whose columns include `key` too.
FACTS = TrackedFact._meta.db_table


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
    as_of: datetime | None = None

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
    (default: the texts), through the rows' tenant's embedding cache."""
    tenant_id = rows[0].tenant_id if rows else 0
    cosines = cosines_cached(vector, texts if embedded is None else embedded, tenant_id=tenant_id)
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
            facts,
            text_sql=f"({FACTS}.key || ' ' || {FACTS}.content)",
            query=q.query,
            config=q.config,
            limit=OTHER_KIND_POOL,
        )
    )
    texts = [f"{r.key}: {r.content}" for r in rows]
    return _row_candidates("fact", rows, texts=texts, embedded=[r.content for r in rows], vector=q.vector)


def _experience_candidates(q: _KindQuery) -> list[ranking.Candidate]:
    """The experiences experiences search would pool for the query (the tenant's shared ones and
    the scope user's own): the nearest by vector, then the best matching a query term."""
    readable = None
    if q.scope.reader_agent is not None:
        readable = sharing.experience_reader_filter(tenant=q.tenant, agent=q.scope.reader_agent)
    if q.scope.bound_agent:
        visible = rows_visible(tenant=q.tenant, agent=q.scope.bound_agent, kind="experience")
        readable = visible if readable is None else readable & visible
    base = q.in_time(
        experiences_visible(
            tenant=q.tenant, user_id=q.scope.user_id, shared_only=q.scope.user_id is None, readable=readable
        ),
        "created_at",
    )
    tsquery = AnyLexemeQuery(q.query) if ranking.tokenize(q.query) else None
    signals = search_candidates(base=base, vector=q.vector, tsquery=tsquery, per_source=OTHER_KIND_POOL)
    by_pk = Experience.objects.defer(*DEFERRED).in_bulk(list(signals))
    rows = [by_pk[pk] for pk in signals]
    return _row_candidates("experience", rows, texts=[r.text for r in rows], vector=q.vector)


def _user_memory_candidates(q: _KindQuery) -> list[ranking.Candidate]:
    """The memories of the scope's users (current ones, or those current at `as_of`)."""
    # A user's scope covers that user's memories even before any session of theirs; narrowed to
    # an agent, a session or a bound key's agent, only while it holds sessions of that user (their
    # pks are filtered by it); any other scope covers the users of its sessions.
    user_id = q.scope.user_id
    narrowed = q.scope.agent or q.scope.session or q.scope.bound_agent
    if user_id is not None and (not narrowed or q.session_pks):
        users: list[str] | None = [user_id]
    else:
        users = scope_user_ids(tenant=q.tenant, session_pks=q.session_pks)
    readable = None
    if q.scope.bound_agent:
        readable = rows_visible(tenant=q.tenant, agent=q.scope.bound_agent, kind="user_memory")
    return user_memory_candidates(
        tenant=q.tenant, user_ids=users, query=q.query, vector=q.vector, as_of=q.as_of,
        time_from=q.time_from, time_to=q.time_to, readable=readable,
    )  # fmt: skip


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
    as_of: datetime | None = None,
) -> list[ranking.Candidate]:
    """Summaries, facts, experiences and user memories of the scope among `kinds`, in that order."""
    q = _KindQuery(
        tenant=tenant, session_pks=session_pks, scope=scope, query=query, vector=vector, config=config,
        time_from=time_from, time_to=time_to, as_of=as_of,
    )  # fmt: skip
    candidates: list[ranking.Candidate] = []
    for kind, step in (
        ("summary", _summary_candidates),
        ("fact", _fact_candidates),
        ("experience", _experience_candidates),
        ("user_memory", _user_memory_candidates),
    ):
        if kind in kinds:
            candidates += step(q)
    return candidates


def kinds_present(*, tenant: Tenant, kinds: set[str], session_pks: list[int] | None) -> set[str]:
    """Which of `kinds` (other than messages) the scope holds any row of, in one statement: a
    kind it holds none of then costs a search no query. Summaries, digests and facts are
    checked within the scope's sessions; experiences and user memories within the tenant (their
    own visibility rules narrow them later)."""
    in_sessions = "" if session_pks is None else " AND x.session_id = ANY(%s)"
    scoped: list[Any] = [tenant.pk] if session_pks is None else [tenant.pk, session_pks]
    checks: dict[str, tuple[str, list[Any]]] = {
        "summary": (
            f"EXISTS (SELECT 1 FROM {Summary._meta.db_table} x WHERE x.tenant_id = %s{in_sessions}) "
            f"OR EXISTS (SELECT 1 FROM {SessionDigest._meta.db_table} x WHERE x.tenant_id = %s{in_sessions})",
            scoped + scoped,
        ),
        "fact": (f"EXISTS (SELECT 1 FROM {FACTS} x WHERE x.tenant_id = %s{in_sessions})", scoped),
        "experience": (
            f"EXISTS (SELECT 1 FROM {Experience._meta.db_table} x WHERE x.tenant_id = %s)",
            [tenant.pk],
        ),
        "user_memory": (
            f"EXISTS (SELECT 1 FROM {UserMemory._meta.db_table} x WHERE x.tenant_id = %s)",
            [tenant.pk],
        ),
    }
    asked = [kind for kind in checks if kind in kinds]
    if not asked:
        return set()
    row = fetch_rows(
        "SELECT " + ", ".join(f"({checks[kind][0]})" for kind in asked),
        [param for kind in asked for param in checks[kind][1]],
    )[0]
    return {kind for kind, present in zip(asked, row, strict=True) if present}
