"""The candidates of one search: the scope's messages (from the cached corpus, or for a very large
scope from PostgreSQL's HNSW and full-text indexes) and its summaries, facts and experiences."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from memory.models import Message, Session, Summary, Tenant, TrackedFact
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
from memory.services.memory_search.corpus import exact_message_candidates, scope_corpus
from memory.services.memory_search.digests import digest_candidates
from memory.services.memory_search.large_stats import corpus_stats, term_counts
from memory.services.memory_search.scope import SearchScope
from memory.services.memory_search.sql import (
    MessageCandidate,
    ScopeWhere,
    fetch_rows,
    terms_or_query,
    vector_literal,
)
from memory.services.memory_search.user_memories import scope_user_ids, user_memory_candidates

VectorSource = Callable[[], np.ndarray | None]  # the query's embedding, when it is needed

OTHER_KIND_POOL = 50  # summaries / facts / experiences per source

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


LEXICAL_ROWS_MAX = 500  # large scopes: the lexical pool visits about this many rows of its rarest terms
LEXICAL_PAIRS_TERMS = 8  # ... and those matching two of its next most selective terms
# Large scopes: a bounded pool, half of ranking.py's 100 / 100 and a third of its 30 seeds (on the
# dev set pools of 20 to 100 per list gave the same recall; 10 seeds instead of 15: R@5 70.8 → 70.5,
# R@10 80.8 → 80.8 through this path, `bench/bench_recall_large_path.py`): ~210 candidates to rank
# in Python instead of ~550 (~14 ms) or ~270 with 15 seeds (1-2 ms more per whole-tenant search).
LARGE_POOL_DENSE = 50
LARGE_POOL_LEXICAL = 50
LARGE_POOL_SEEDS = 10


def _lexical_queries(counts: dict[str, int | None]) -> tuple[str, str]:
    """The lexical pool's tsqueries: which rows to visit, and what to rank them by (ts_rank_cd);
    empty when no term is rarer than LARGE_TERM_CAP.

    Only rows matching the rarer terms are ranked: an OR of common words would make PostgreSQL rank
    most of a large scope. Each row ranked is a heap visit, so the rows visited are those of the
    rarest terms, up to about LEXICAL_ROWS_MAX rows (at least the rarest term's: the terms BM25
    weighs most), and of the others those matching two of them or more (GIN intersects those
    without visiting rows). All are ranked by every rarer term. A scope whose rarer terms match
    LEXICAL_ROWS_MAX rows or fewer in all visits them all.

    A query whose every term is common (each in more than LARGE_TERM_CAP rows) or absent has no
    lexical pool: ranking every row of one common word (a name in 12 % of 100,000 messages: 12,600
    rows) cost 28-52 ms for a signal that hardly tells those rows apart, and any subset of them
    would be arbitrary (and a LIMIT invites a plan that scans until it has enough). The dense pool,
    and BM25 within the pool, rank such a query."""
    rare = [term for term, count in counts.items() if count]
    if not rare:
        return "", ""
    by_rows = sorted(rare, key=lambda term: counts[term] or 0)
    visit, rows = [by_rows[0]], counts[by_rows[0]] or 0
    for term in by_rows[1:]:
        rows += counts[term] or 0
        if rows > LEXICAL_ROWS_MAX:
            break
        visit.append(term)
    rank_by = " | ".join(rare)
    if len(visit) == len(rare):
        return rank_by, rank_by
    left = by_rows[len(visit) :][:LEXICAL_PAIRS_TERMS]
    pairs = [f"({a} & {b})" for i, a in enumerate(left) for b in left[i + 1 :]]
    return " | ".join(visit + pairs), rank_by


# Both statements return a message's row in this shape (`_row_candidate`): occurred_at as
# microseconds since the epoch, exact and ~20x cheaper to load than a timestamptz in text format
# (2.7 ms of a whole-tenant search for ~270 rows).
_ROW_COLUMNS = (
    "m.id, s.public_id, m.seq, m.name, m.content, (extract(epoch FROM m.occurred_at) * 1000000)::bigint"
)


def _row_candidate(row: tuple[Any, ...], dense: float | None) -> MessageCandidate:
    pk, session_public_id, seq, name, content, micros = row[:6]
    occurred_at = _EPOCH + timedelta(microseconds=micros)
    return MessageCandidate(
        key=f"message:{pk}",
        kind="message",
        text=ranking.index_text(content=content, speaker=name or None, occurred_at=occurred_at),
        group=session_public_id,
        position=int(seq),
        occurred_at=occurred_at,
        dense=dense,
        speaker=name,
        content=content,
    )


def _message_candidates(
    *,
    where: ScopeWhere,
    vector_source: VectorSource,
    config: str,
    plan: ranking.Plan,
    counts: dict[str, int | None],
) -> list[ranking.Candidate]:
    """The bounded pool of a large scope in two statements: the lexical pool with its neighbours'
    rows, built and tokenised while the query's embedding is still being computed on its own
    thread; then the dense pool with its neighbours' rows and every candidate's cosine."""
    radius = plan.neighbour_radius if plan.neighbour_weight > 0 else 0
    found = _lexical_pool(where=where, config=config, counts=counts, radius=radius)
    ranking.messages_prepare([candidate.text for candidate in found.values()])
    vector = vector_source()
    if vector is not None:
        _dense_pool(where=where, vector=vector, radius=radius, found=found)
    return list(found.values())


def _lexical_pool(
    *, where: ScopeWhere, config: str, counts: dict[str, int | None], radius: int
) -> dict[int, MessageCandidate]:
    """Message id → candidate (no cosine yet) of the best LARGE_POOL_LEXICAL rows by ts_rank_cd
    and the turns within `radius` of the best LARGE_POOL_SEEDS of them (by the (session, seq)
    index, one nested-loop probe per seed: an EXISTS in the WHERE clause would be evaluated for
    every row of the scope)."""
    visit, rank_by = _lexical_queries(counts)
    if not visit:
        return {}
    table = Message._meta.db_table
    chosen = "SELECT l.id FROM lexical l"
    chosen_params: list[Any] = []
    if radius:
        chosen += (
            f" UNION SELECT near.id FROM (SELECT l.session_id, l.seq FROM lexical l "
            f"ORDER BY l.rank DESC, l.id LIMIT {LARGE_POOL_SEEDS:d}) seed JOIN {table} near "
            "ON near.session_id = seed.session_id AND near.seq BETWEEN seed.seq - %s AND seed.seq + %s"
        )
        chosen_params += [radius, radius]
    rows = fetch_rows(
        f"WITH lexical AS MATERIALIZED (SELECT m.id, m.session_id, m.seq, "
        f"ts_rank_cd(m.search_vector, q) AS rank FROM {table} m, to_tsquery(%s::regconfig, %s) v, "
        f"to_tsquery(%s::regconfig, %s) q WHERE {where.where} AND m.search_vector @@ v "
        f"ORDER BY rank DESC, m.id LIMIT {LARGE_POOL_LEXICAL:d}) "
        f"SELECT {_ROW_COLUMNS} FROM {table} m JOIN {Session._meta.db_table} s ON s.id = m.session_id "
        f"WHERE {where.where} AND m.id IN ({chosen})",
        [config, visit, config, rank_by, *where.params, *where.params, *chosen_params],
    )
    return {row[0]: _row_candidate(row, None) for row in rows}


def _dense_pool(
    *, where: ScopeWhere, vector: np.ndarray, radius: int, found: dict[int, MessageCandidate]
) -> None:
    """Add to `found` the best LARGE_POOL_DENSE rows by cosine (HNSW) and the turns within
    `radius` of the best LARGE_POOL_SEEDS of them, and give every candidate its cosine. One
    statement: the rows already in `found` come back as their cosine alone."""
    table = Message._meta.db_table
    configure_hnsw()
    literal = vector_literal(vector)
    known = "{" + ",".join(map(str, found)) + "}"  # bigint[] as text: ~10x cheaper than a list's dumper
    chosen = "SELECT unnest(d.ids) FROM dense d"
    chosen_params: list[Any] = []
    if radius:
        chosen += (
            f" UNION SELECT near.id FROM dense d, {table} seed JOIN {table} near "
            "ON near.session_id = seed.session_id AND near.seq BETWEEN seed.seq - %s AND seed.seq + %s "
            f"WHERE seed.id = ANY(d.ids[1:{LARGE_POOL_SEEDS:d}])"
        )
        chosen_params += [radius, radius]
    rows = fetch_rows(
        "WITH dense AS MATERIALIZED (SELECT coalesce(array_agg(d.id ORDER BY d.distance, d.id), '{}') "
        f"AS ids FROM (SELECT m.id, m.embedding <=> %s::vector AS distance FROM {table} m "
        f"WHERE {where.where} AND m.embedding IS NOT NULL ORDER BY m.embedding <=> %s::vector "
        f"LIMIT {LARGE_POOL_DENSE:d}) d) "
        f"SELECT {_ROW_COLUMNS}, 1 - (m.embedding <=> %s::vector) FROM {table} m "
        f"JOIN {Session._meta.db_table} s ON s.id = m.session_id "
        f"WHERE {where.where} AND m.id IN ({chosen}) AND m.id <> ALL(%s::bigint[]) "
        "UNION ALL SELECT m.id, NULL, NULL, NULL, NULL, NULL, 1 - (m.embedding <=> %s::vector) "
        f"FROM {table} m WHERE m.id = ANY(%s::bigint[])",
        [
            literal, *where.params, literal,
            literal, *where.params, *chosen_params, known,
            literal, known,
        ],
    )  # fmt: skip
    for row in rows:
        dense = None if row[6] is None else float(row[6])
        if row[1] is None:
            found[row[0]].dense = dense
        else:
            found[row[0]] = _row_candidate(row, dense)


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
    _, _, signals = search_candidates(base=base, vector=q.vector, tsquery=tsquery, per_source=OTHER_KIND_POOL)
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


def scope_message_candidates(
    *, where: ScopeWhere, query: str, vector: VectorSource, config: str, plan: ranking.Plan
) -> tuple[list[ranking.Candidate], ranking.CorpusStats]:
    """The scope's message pool and its BM25 statistics: exact from the cached scope, or (a very
    large scope) approximated by PostgreSQL's full text. `vector` gives the query's embedding
    (waiting for it if need be), called once the SQL that does not need it has run."""
    corpus = scope_corpus(where)
    if corpus is not None:
        found, stats = exact_message_candidates(
            corpus=corpus, where=where, query=query, vector=vector, plan=plan
        )
        return list(found), stats
    terms = list(dict.fromkeys(ranking.tokenize(query)))
    counts = term_counts(where=where, terms=terms, config=config)
    found = _message_candidates(where=where, vector_source=vector, config=config, plan=plan, counts=counts)
    return list(found), corpus_stats(where=where, counts=counts)
