"""Memory search: messages, summaries, facts and experiences of a scope, ranked for a query.

The candidate pool follows memory/services/ranking.py's contract: the top POOL_DENSE messages by
cosine (pgvector HNSW), the top POOL_LEXICAL by full text (an OR of the query's terms over the
generated tsvector, GIN), the turns within ±radius of the best POOL_NEIGHBOUR_SEEDS hits of each
list, plus the scope's summaries, tracked facts and experiences that match either way. BM25
statistics (rows, mean length, document frequency of the query's terms) are taken over the
scope's messages in one aggregate query. `ranking.rank` scores the union; we cut to `limit`.

Scope: a session (only it, or every session of its user — or of its agent when it has no user),
a user's sessions, an agent's sessions (optionally one user's), or the whole tenant. Every query
is filtered by the tenant; an unknown or foreign session or agent is NotFound. Agent-private
context (memory.services.layers) is never searched; experiences are the tenant's shared ones
plus the scope user's own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from itertools import zip_longest
from typing import Any

import numpy as np
from django.db import connection
from django.utils import timezone

from memory.exceptions import InvalidInput
from memory.models import Message, Session, Summary, Tenant, TrackedFact
from memory.models.experiences import Experience, ExperienceScope
from memory.selectors.sessions import agent_get, session_get
from memory.services import ranking
from memory.services.embedding import EMBEDDING_DIMENSIONS, EmbedderError, cosines_cached, embed_query
from memory.services.memory_digest import digest_candidates
from memory.services.memory_index import memory_policy_get
from memory.services.retrieval import _configure_hnsw

logger = logging.getLogger(__name__)

KINDS = ("message", "summary", "fact", "experience")
SESSIONS_CHOICES = ("current", "all")
MAX_LIMIT = 100
MAX_NEIGHBOURS = 5
OTHER_KIND_POOL = 50  # summaries / facts / experiences per source


@dataclass(frozen=True)
class SearchScope:
    agent: str | None = None
    user_id: str | None = None
    session: str | None = None
    sessions: str = "all"  # "current" (only `session`) | "all"


@dataclass
class SearchHit:
    kind: str
    id: str
    session: str | None
    seq: int | None
    occurred_at: datetime | None
    text: str
    score: float
    contributions: dict[str, float]
    speaker: str = ""
    neighbours: list[dict[str, Any]] | None = None
    similarity: float | None = None  # raw cosine to the query (None: no vector)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind,
            "id": self.id,
            "session": self.session,
            "seq": self.seq,
            "occurred_at": self.occurred_at.isoformat() if self.occurred_at else None,
            "speaker": self.speaker,
            "text": self.text,
            "score": self.score,
            "similarity": None if self.similarity is None else round(self.similarity, 4),
            "contributions": self.contributions,
        }
        if self.neighbours is not None:
            data["neighbours"] = self.neighbours
        return data


@dataclass
class SearchResult:
    query: str
    results: list[SearchHit]
    plan: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    candidates: int = 0


@dataclass
class _MessageCandidate(ranking.Candidate):
    speaker: str = ""
    content: str = ""


def message_id(session_public_id: str, seq: int) -> str:
    """A message's id in search results: `<session id>:<seq>`."""
    return f"{session_public_id}:{seq}"


def plan_parse(data: Any, *, field_name: str = "plan") -> ranking.Plan:
    """A ranking plan from a request (None → defaults). Raises InvalidInput naming the field."""
    if data is None:
        return ranking.DEFAULT_PLAN
    if not isinstance(data, dict):
        raise InvalidInput(details={"fields": {field_name: ["Expected an object of plan fields."]}})
    try:
        return ranking.Plan.from_dict(data)
    except ValueError as exc:
        name, _, reason = str(exc).partition(":")
        raise InvalidInput(
            f"{field_name}.{name}: {reason.strip()}",
            details={"fields": {f"{field_name}.{name}": [reason.strip()]}},
        ) from exc


def scope_sessions(*, tenant: Tenant, scope: SearchScope) -> tuple[list[int] | None, dict[int, str]]:
    """The session pks the scope covers (None = the whole tenant) and their public ids.

    Raises NotFound for an unknown (or another tenant's) session or agent. Read-only.
    """
    queryset = Session.objects.filter(tenant=tenant)
    if scope.session:
        current = session_get(tenant=tenant, session_id=scope.session)
        if scope.sessions == "current":
            return [current.pk], {current.pk: current.public_id}
        if scope.user_id is None and current.user_id:
            queryset = queryset.filter(user_id=current.user_id)
        if scope.agent is None and not current.user_id:
            queryset = queryset.filter(agent_id=current.agent_id)
    if scope.agent:
        queryset = queryset.filter(agent=agent_get(tenant=tenant, external_id=scope.agent))
    if scope.user_id is not None:
        queryset = queryset.filter(user_id=scope.user_id)
    if not scope.session and not scope.agent and scope.user_id is None:
        return None, {}
    rows = dict(queryset.values_list("pk", "public_id"))
    return list(rows), rows


def _vector_literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in vector.tolist()) + "]"


def _or_query(query: str) -> str:
    """The query's terms OR-ed for to_tsquery (terms are [a-z0-9]+, so nothing to escape)."""
    return " | ".join(dict.fromkeys(ranking.tokenize(query)))


class _Sql:
    """The WHERE clause shared by every message query of one search."""

    def __init__(
        self,
        *,
        tenant: Tenant,
        session_pks: list[int] | None,
        time_from: datetime | None,
        time_to: datetime | None,
    ) -> None:
        clauses = ["m.tenant_id = %s"]
        params: list[Any] = [tenant.pk]
        if session_pks is not None:
            clauses.append("m.session_id = ANY(%s)")
            params.append(session_pks)
        if time_from is not None:
            clauses.append("m.occurred_at >= %s")
            params.append(time_from)
        if time_to is not None:
            clauses.append("m.occurred_at <= %s")
            params.append(time_to)
        self.where = " AND ".join(clauses)
        self.params = params


def _fetch(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


LARGE_TERM_CAP = 5_000  # large scopes: a term matching more rows than this counts as common
LARGE_STATS_SECONDS = 300.0  # large scopes: rows and mean length are re-measured this often
_large_stats: dict[tuple[Any, ...], tuple[float, int, float]] = {}


def _scope_key(where: _Sql) -> tuple[Any, ...]:
    return (where.where, *[tuple(p) if isinstance(p, list) else p for p in where.params])


_large_term_counts: dict[tuple[Any, ...], tuple[float, int | None]] = {}
LARGE_TERM_COUNTS_KEPT = 50_000  # (scope, term) counts kept per process


def _term_counts(*, where: _Sql, terms: list[str], config: str) -> dict[str, int | None]:
    """Rows matching each term, counted through the GIN index up to LARGE_TERM_CAP (None: more,
    or a word PostgreSQL's configuration ignores). Re-counted every LARGE_STATS_SECONDS, like the
    scope's size: a common word costs a scan of up to 5,001 rows. At most one query."""
    now = time.monotonic()
    key = (*_scope_key(where), config)
    known = {t: _large_term_counts.get((*key, t)) for t in terms}
    fresh = {t: hit[1] for t, hit in known.items() if hit is not None and now - hit[0] <= LARGE_STATS_SECONDS}
    missing = [t for t in terms if t not in fresh]
    if missing:
        if len(_large_term_counts) > LARGE_TERM_COUNTS_KEPT:
            _large_term_counts.clear()
        for term, count in _term_counts_query(where=where, terms=missing, config=config).items():
            fresh[term] = count
            _large_term_counts[(*key, term)] = (now, count)
    return {term: fresh[term] for term in terms}


def _term_counts_query(*, where: _Sql, terms: list[str], config: str) -> dict[str, int | None]:
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


def _corpus_stats(*, where: _Sql, counts: dict[str, int | None]) -> ranking.CorpusStats:
    """Statistics of a large scope: rows and mean lexeme count (re-measured every 5 minutes), the
    exact document frequency of its rarer terms; common terms are counted in the pool (ranking)."""
    key = _scope_key(where)
    now = time.monotonic()
    cached = _large_stats.get(key)
    if cached is None or now - cached[0] > LARGE_STATS_SECONDS:
        table = Message._meta.db_table
        row = _fetch(
            f"SELECT count(*), coalesce(avg(length(m.search_vector)), 0) FROM {table} m WHERE {where.where}",
            where.params,
        )[0]
        cached = _large_stats[key] = (now, int(row[0]), float(row[1]))
    df = {term: count for term, count in counts.items() if count is not None}
    return ranking.CorpusStats(n_docs=cached[1], avg_len=cached[2], df=df)


SCOPE_CORPUS_MAX = 20_000  # scopes up to this many messages get exact BM25 statistics (cached)
SCOPE_CORPUS_CACHE = 64  # scopes kept per process
SCOPE_CORPUS_ROWS = 200_000  # ... and at most this many messages over all of them (~1.5 kB each)


@dataclass
class _ScopeCorpus:
    """The scope's messages, tokenised once: exact BM25 statistics and lexical pool (ranking's contract)."""

    ids: list[int]
    rows: dict[int, tuple[str, int, str, str, datetime]]  # id → (session, seq, name, content, occurred_at)
    texts: list[str]  # ranking.index_text of each row
    tokens: list[frozenset[str]]
    df: Counter[str]
    avg_len: float
    by_position: dict[tuple[str, int], int]  # (session, seq) → index
    # Each row's embedding (float32, unit length as stored; zeros where `embedded` is False): the
    # dense pool and the candidates' cosines are exact dot products here, no SQL round trip.
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    embedded: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


_corpora: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], _ScopeCorpus]] = OrderedDict()
_corpora_lock = threading.Lock()


_large_scopes: dict[tuple[Any, ...], float] = {}
LARGE_SCOPE_RECHECK_SECONDS = 60.0


def _scope_corpus(where: _Sql) -> _ScopeCorpus | None:
    """The cached corpus of the scope, refreshed when its messages changed; None if too large."""
    table = Message._meta.db_table
    seen_large = _large_scopes.get(_scope_key(where))
    if seen_large is not None and time.monotonic() - seen_large < LARGE_SCOPE_RECHECK_SECONDS:
        return None
    # The version: rows (count, newest id) and their vectors (how many, which model). A new
    # message, a deletion, an embedding drained or a re-embedding with another model changes it.
    count, max_id, embedded, model_lo, model_hi = _fetch(
        f"SELECT count(*), coalesce(max(m.id), 0), count(m.embedding), "
        f"coalesce(min(m.embedding_model), ''), coalesce(max(m.embedding_model), '') "
        f"FROM {table} m WHERE {where.where}",
        where.params,
    )[0]
    key = _scope_key(where)
    if count > SCOPE_CORPUS_MAX:
        _large_scopes[key] = time.monotonic()
        return None
    version = (int(count), int(max_id), int(embedded), model_lo, model_hi)
    with _corpora_lock:
        cached = _corpora.get(key)
        if cached is not None and cached[0] == version:
            _corpora.move_to_end(key)
            return cached[1]
    sessions_table = Session._meta.db_table
    rows = _fetch(
        f"SELECT m.id, s.public_id, m.seq, m.name, m.content, m.occurred_at, m.embedding::text "
        f"FROM {table} m JOIN {sessions_table} s ON s.id = m.session_id WHERE {where.where} ORDER BY m.id",
        where.params,
    )
    vectors = np.zeros((len(rows), EMBEDDING_DIMENSIONS), dtype=np.float32)
    has_vector = np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows):
        if r[6] is not None:
            vectors[i] = np.array(r[6][1:-1].split(","), dtype=np.float32)
            has_vector[i] = True
    ids = [r[0] for r in rows]
    texts = [ranking.index_text(content=r[4], speaker=r[3] or None, occurred_at=r[5]) for r in rows]
    token_lists = [ranking.tokenize(t) for t in texts]
    tokens = [frozenset(t) for t in token_lists]
    df: Counter[str] = Counter()
    for toks in tokens:
        df.update(toks)
    corpus = _ScopeCorpus(
        ids=ids,
        rows={r[0]: (r[1], int(r[2]), r[3], r[4], r[5]) for r in rows},
        texts=texts,
        tokens=tokens,
        df=df,
        avg_len=sum(len(t) for t in token_lists) / max(1, len(token_lists)),
        by_position={(r[1], int(r[2])): i for i, r in enumerate(rows)},
        vectors=vectors,
        embedded=has_vector,
    )
    with _corpora_lock:
        _corpora[key] = (version, corpus)
        while len(_corpora) > 1 and (
            len(_corpora) > SCOPE_CORPUS_CACHE
            or sum(len(c.ids) for _, c in _corpora.values()) > SCOPE_CORPUS_ROWS
        ):
            _corpora.popitem(last=False)
    return corpus


def _corpuscosines_cached(corpus: _ScopeCorpus, vector: np.ndarray) -> np.ndarray:
    """Cosine of every corpus row to the query, as pgvector's `1 - (a <=> b)`; NaN without a vector."""
    dots = corpus.vectors.astype(np.float64) @ vector.astype(np.float64)
    norms = np.linalg.norm(corpus.vectors, axis=1).astype(np.float64) * float(np.linalg.norm(vector))
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = dots / norms
    cosines[~corpus.embedded] = np.nan
    return cosines


def _exact_message_candidates(
    *, corpus: _ScopeCorpus, where: _Sql, query: str, vector: np.ndarray | None, plan: ranking.Plan
) -> tuple[list[ranking.Candidate], ranking.CorpusStats]:
    """Pool and statistics exactly as ranking.py's contract (and the offline bench) define them."""
    terms = set(ranking.tokenize(query))
    stats = ranking.CorpusStats(
        n_docs=len(corpus.ids), avg_len=corpus.avg_len, df={t: corpus.df.get(t, 0) for t in terms}
    )
    cosines: np.ndarray | None = None
    dense_top: list[int] = []
    if vector is not None and corpus.embedded.any():
        cosines = _corpuscosines_cached(corpus, vector)
        with_vector = np.flatnonzero(corpus.embedded)
        best = np.argsort(-cosines[with_vector], kind="stable")[: ranking.POOL_DENSE]
        dense_top = [int(i) for i in with_vector[best]]
    matching = [i for i, toks in enumerate(corpus.tokens) if terms & toks]
    lexical_top: list[int] = []
    if matching:
        scores = ranking.bm25_scores(
            query=query, texts=[corpus.texts[i] for i in matching], stats=stats, k1=plan.k1, b=plan.b
        )
        lexical_top = [matching[j] for j in np.argsort(-scores, kind="stable")[: ranking.POOL_LEXICAL]]
    chosen = dict.fromkeys(dense_top + lexical_top)
    radius = plan.neighbour_radius if plan.neighbour_weight > 0 else 0
    seeds = dense_top[: ranking.POOL_NEIGHBOUR_SEEDS] + lexical_top[: ranking.POOL_NEIGHBOUR_SEEDS]
    for seed in seeds if radius else []:
        session, seq, *_ = corpus.rows[corpus.ids[seed]]
        for offset in range(-radius, radius + 1):
            j = corpus.by_position.get((session, seq + offset))
            if j is not None:
                chosen.setdefault(j)
    candidates: list[ranking.Candidate] = []
    for i in chosen:
        pk = corpus.ids[i]
        session, seq, name, content, occurred_at = corpus.rows[pk]
        cos = None if cosines is None or not corpus.embedded[i] else float(cosines[i])
        candidates.append(
            _MessageCandidate(
                key=f"message:{pk}", kind="message", text=corpus.texts[i], group=session, position=seq,
                occurred_at=occurred_at, dense=None if cos is None else float(cos), speaker=name,
                content=content,
            )
        )  # fmt: skip
    return candidates, stats


def _message_candidates(
    *,
    where: _Sql,
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
            for r in _fetch(
                f"SELECT m.id FROM {table} m WHERE {where.where} AND m.embedding IS NOT NULL "
                f"ORDER BY m.embedding <=> %s::vector LIMIT %s",
                [*where.params, _vector_literal(vector), ranking.POOL_DENSE],
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
            for r in _fetch(
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
    cosine_params = [_vector_literal(vector)] if vector is not None else []
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
    rows = _fetch(
        f"SELECT m.id, s.public_id, m.seq, m.name, m.content, m.occurred_at, {cosine} "
        f"FROM {table} m JOIN {sessions_table} s ON s.id = m.session_id "
        f"WHERE {where.where} AND m.id IN ({chosen})",
        [*cosine_params, *where.params, *params],
    )
    return [
        _MessageCandidate(
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
    or_query = _or_query(query)
    if not or_query:
        return queryset.none()
    return queryset.extra(
        where=[f"to_tsvector(%s::regconfig, {text_sql}) @@ to_tsquery(%s::regconfig, %s)"],
        params=[config, config, or_query],
    )[:limit]


def _other_candidates(
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
    candidates: list[ranking.Candidate] = []

    def in_time(queryset: Any, field_name: str) -> Any:
        if time_from is not None:
            queryset = queryset.filter(**{f"{field_name}__gte": time_from})
        if time_to is not None:
            queryset = queryset.filter(**{f"{field_name}__lte": time_to})
        return queryset

    if "summary" in kinds:
        summaries = in_time(
            Summary.objects.filter(tenant=tenant, is_current=True).select_related("session"), "created_at"
        )
        if session_pks is not None:
            summaries = summaries.filter(session_id__in=session_pks)
        rows = list(
            _text_rows_matching(summaries, text_sql="text", query=query, config=config, limit=OTHER_KIND_POOL)
        )
        for row, cos in zip(rows, cosines_cached(vector, [r.text for r in rows]), strict=True):
            candidates.append(
                ranking.Candidate(
                    key=f"summary:{row.public_id}", kind="summary", text=row.text, group=None,
                    position=None, occurred_at=row.created_at, dense=cos,
                )
            )  # fmt: skip
        # The sessions' digests (medium-term memory) are summaries too.
        candidates += digest_candidates(
            tenant=tenant, query=query, session_pks=session_pks, vector=vector,
            time_from=time_from, time_to=time_to, limit=OTHER_KIND_POOL,
        )  # fmt: skip
    if "fact" in kinds:
        facts = in_time(TrackedFact.objects.filter(tenant=tenant).select_related("session"), "created_at")
        if session_pks is not None:
            facts = facts.filter(session_id__in=session_pks)
        rows = list(
            _text_rows_matching(
                facts, text_sql="(key || ' ' || content)", query=query, config=config, limit=OTHER_KIND_POOL
            )
        )
        for row, cos in zip(rows, cosines_cached(vector, [r.content for r in rows]), strict=True):
            candidates.append(
                ranking.Candidate(
                    key=f"fact:{row.public_id}", kind="fact", text=f"{row.key}: {row.content}", group=None,
                    position=None, occurred_at=row.created_at, dense=cos,
                )
            )  # fmt: skip
    if "experience" in kinds:
        from django.db.models import Q

        from memory.services.experiences import visible_filter

        visible = Q(scope=ExperienceScope.TENANT)
        if scope.user_id:
            visible |= Q(user_id=scope.user_id)
        experiences = in_time(
            Experience.objects.filter(tenant=tenant).filter(visible_filter()).filter(visible), "created_at"
        ).defer("embedding", "problem_embedding", "search_vector")
        found: dict[int, Experience] = {}
        if vector is not None:
            from pgvector.django import CosineDistance

            _configure_hnsw()
            for row in experiences.exclude(embedding=None).order_by(CosineDistance("embedding", vector))[
                :OTHER_KIND_POOL
            ]:
                found[row.pk] = row
        or_query = _or_query(query)
        if or_query:
            for row in experiences.extra(
                where=["search_vector @@ to_tsquery(%s::regconfig, %s)"], params=["english", or_query]
            )[:OTHER_KIND_POOL]:
                found.setdefault(row.pk, row)
        rows = list(found.values())
        for row, cos in zip(rows, cosines_cached(vector, [r.text for r in rows]), strict=True):
            candidates.append(
                ranking.Candidate(
                    key=f"experience:{row.public_id}", kind="experience", text=row.text, group=None,
                    position=None, occurred_at=row.created_at, dense=cos,
                )
            )  # fmt: skip
    return candidates


def memory_search(
    *,
    tenant: Tenant,
    query: str,
    scope: SearchScope | None = None,
    kinds: list[str] | None = None,
    limit: int = 10,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    plan: ranking.Plan | None = None,
    neighbours: int = 0,
    exclude_messages: set[tuple[str, int]] | None = None,
) -> SearchResult:
    """Search the scope's conversational memory for `query`; best first, at most `limit` hits.

    Read-only. Raises InvalidInput (empty query, unknown kind, limit or neighbours out of
    range) and NotFound (unknown or foreign session / agent in the scope). When the embedder is
    unavailable the dense signal is left out with a warning (words still answer).
    `exclude_messages` ((session id, seq) pairs) are left out of the results (context recall:
    what the window already holds).
    """
    scope = scope or SearchScope()
    query = (query or "").strip()
    chosen = _search_validate(query=query, scope=scope, kinds=kinds, limit=limit, neighbours=neighbours)
    plan_given = plan is not None
    plan = plan or ranking.DEFAULT_PLAN
    session_pks, _ = scope_sessions(tenant=tenant, scope=scope)
    config = memory_policy_get(tenant=tenant).text_search_config or "english"
    warnings: list[str] = []
    vector: np.ndarray | None = None
    try:
        _, vector = embed_query(query)
    except EmbedderError as exc:
        warnings.append(f"The embedder is unavailable ({exc}); results are ranked by words only.")
    kind_set = set(chosen)
    if session_pks == []:
        kind_set -= {"message", "summary", "fact"}
    where = _Sql(tenant=tenant, session_pks=session_pks, time_from=time_from, time_to=time_to)
    candidates: list[ranking.Candidate] = []
    stats = ranking.CorpusStats(n_docs=0, avg_len=0.0)
    if "message" in kind_set:
        candidates, stats = _scope_message_candidates(
            where=where, query=query, vector=vector, config=config, plan=plan
        )
    candidates += _other_candidates(
        tenant=tenant, kinds=kind_set, session_pks=session_pks, scope=scope, query=query,
        vector=vector, config=config, time_from=time_from, time_to=time_to,
    )  # fmt: skip
    ranked = _rank_by_kind(
        query=query, candidates=candidates, stats=stats, plan=plan, experience_plan_given=plan_given
    )
    excluded = exclude_messages or set()
    hits = [
        _hit(item)
        for item in ranked
        if not (
            item.candidate.kind == "message" and (item.candidate.group, item.candidate.position) in excluded
        )
    ][:limit]
    if neighbours:
        _attach_neighbours(tenant=tenant, hits=hits, radius=neighbours)
    return SearchResult(
        query=query, results=hits, plan=plan.as_dict(), warnings=warnings, candidates=len(candidates)
    )


def _search_validate(
    *, query: str, scope: SearchScope, kinds: list[str] | None, limit: int, neighbours: int
) -> list[str]:
    """The chosen kinds, once every argument is valid. Raises InvalidInput naming the field."""
    if not query:
        raise InvalidInput("query must not be empty.", details={"fields": {"query": ["Must not be empty."]}})
    chosen = list(dict.fromkeys(kinds or KINDS))
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise InvalidInput(
            f"Unknown kind {unknown[0]!r}; kinds are {', '.join(KINDS)}.",
            details={"fields": {"kinds": [f"Unknown kind {k!r}." for k in unknown]}},
        )
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(details={"fields": {"limit": [f"Must be between 1 and {MAX_LIMIT}."]}})
    if not 0 <= neighbours <= MAX_NEIGHBOURS:
        raise InvalidInput(details={"fields": {"neighbours": [f"Must be between 0 and {MAX_NEIGHBOURS}."]}})
    if scope.sessions not in SESSIONS_CHOICES:
        raise InvalidInput(details={"fields": {"scope.sessions": ["Must be 'current' or 'all'."]}})
    if scope.sessions == "current" and not scope.session:
        raise InvalidInput(details={"fields": {"scope.session": ["Required when sessions is 'current'."]}})
    return chosen


def _scope_message_candidates(
    *, where: _Sql, query: str, vector: np.ndarray | None, config: str, plan: ranking.Plan
) -> tuple[list[ranking.Candidate], ranking.CorpusStats]:
    """The scope's message pool and its BM25 statistics: exact from the cached scope, or (a very
    large scope) approximated by PostgreSQL's full text."""
    corpus = _scope_corpus(where)
    if corpus is not None:
        found, stats = _exact_message_candidates(
            corpus=corpus, where=where, query=query, vector=vector, plan=plan
        )
        return list(found), stats
    terms = list(dict.fromkeys(ranking.tokenize(query)))
    counts = _term_counts(where=where, terms=terms, config=config)
    found = _message_candidates(
        where=where, query=query, vector=vector, config=config, plan=plan, counts=counts
    )
    return list(found), _corpus_stats(where=where, counts=counts)


def _rank_by_kind(
    *,
    query: str,
    candidates: list[ranking.Candidate],
    stats: ranking.CorpusStats,
    plan: ranking.Plan,
    experience_plan_given: bool,
) -> list[ranking.Ranked]:
    """Experiences (problem/solution texts) rank in their own pool under EXPERIENCE_PLAN unless the
    caller chose a plan; the two lists merge by rank (ranking.py: "rank the two kinds in separate
    pools and merge by rank"), conversational memory first on a tie."""
    conversational = [c for c in candidates if c.kind != "experience"]
    distilled = [c for c in candidates if c.kind == "experience"]
    now = timezone.now()
    ranked_lists = [ranking.rank(query=query, candidates=conversational, stats=stats, plan=plan, now=now)]
    if distilled:
        experience_plan = plan if experience_plan_given else ranking.EXPERIENCE_PLAN
        ranked_lists.append(
            ranking.rank(query=query, candidates=distilled, stats=stats, plan=experience_plan, now=now)
        )
    return [item for group in zip_longest(*ranked_lists) for item in group if item is not None]


def _hit(item: ranking.Ranked) -> SearchHit:
    c = item.candidate
    kind, _, ident = c.key.partition(":")
    if isinstance(c, _MessageCandidate):
        assert c.group is not None and c.position is not None
        return SearchHit(
            kind="message", id=message_id(c.group, c.position), session=c.group, seq=c.position,
            occurred_at=c.occurred_at, text=c.content, speaker=c.speaker, score=item.score,
            contributions=item.contributions, similarity=c.dense,
        )  # fmt: skip
    return SearchHit(
        kind=kind, id=ident, session=None, seq=None, occurred_at=c.occurred_at, text=c.text,
        score=item.score, contributions=item.contributions, similarity=c.dense,
    )  # fmt: skip


def _attach_neighbours(*, tenant: Tenant, hits: list[SearchHit], radius: int) -> None:
    wanted = [(h.session, h.seq) for h in hits if h.kind == "message" and h.session and h.seq is not None]
    if not wanted:
        for h in hits:
            h.neighbours = []
        return
    from django.db.models import Q

    condition = Q()
    for session_public_id, seq in wanted:
        assert seq is not None
        condition |= Q(session__public_id=session_public_id, seq__gte=seq - radius, seq__lte=seq + radius)
    rows = (
        Message.objects.filter(tenant=tenant)
        .filter(condition)
        .select_related("session")
        .only("seq", "role", "name", "content", "occurred_at", "session__public_id")
        .order_by("session_id", "seq")
    )
    by_session: dict[str, list[Message]] = {}
    for row in rows:
        by_session.setdefault(row.session.public_id, []).append(row)
    for h in hits:
        if h.kind != "message" or h.seq is None or h.session is None:
            h.neighbours = []
            continue
        seq = h.seq
        h.neighbours = [
            {
                "seq": m.seq,
                "role": m.role,
                "speaker": m.name,
                "text": m.content,
                "occurred_at": m.occurred_at.isoformat() if m.occurred_at else None,
            }
            for m in by_session.get(h.session, [])
            if m.seq != seq and abs(m.seq - seq) <= radius
        ]
