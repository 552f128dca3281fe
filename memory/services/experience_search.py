"""Hybrid retrieval of experiences (pgvector + full text).

CONTRACT (called by the context engine; keep these signatures):
- experiences_for_context: the memory slot of a built context.
- experiences_mark_used: after a build included them (use count, last used).

Search (`experiences_search`) gathers candidates from two sources — pgvector cosine over the
HNSW index and PostgreSQL full text (an OR query over the query's lexemes, GIN index) — then
ranks them with memory search's ranker (memory/services/ranking.py, `rank`), the one every kind
goes through:

    score = w_vector · z(similarity) + w_text · z(BM25)        (z: over the candidates)
    similarity = 0.6 · cos(query, whole experience) + 0.4 · cos(query, "Problem: …")

A small lexical weight (default 1.0 / 0.1, per-tenant policy) keeps the embedding's paraphrase
ranking and lets exact error strings (and pending rows without a vector) score.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import F, Q, QuerySet, Subquery
from pgvector.django import CosineDistance

from memory.exceptions import InvalidInput
from memory.models import Experience, ExperiencePolicy, ExperienceScope, Tenant
from memory.replica import read_alias
from memory.services import ranking, sharing
from memory.services.embedding import EmbedderError, QueryEmbedding, embed_query
from memory.services.experiences import experiences_touch, scope_filter, visible_filter
from memory.services.search_hit import SearchHit

logger = logging.getLogger(__name__)

SOURCES = ("vector", "text")
FUSIONS = ranking.FUSIONS  # how each signal is normalised over the candidates
CANDIDATES_PER_SOURCE = 50
HNSW_EF_SEARCH = 100
FULL_TEXT_CONFIG = "english"
# ts_rank at which the normalised text score is 0.5 (score = rank / (rank + this)).
TEXT_RANK_HALF = 0.5
TEXT_MATCH_CAP = 300
# similarity = 0.6 · cosine(query, problem + cause + solution) + 0.4 · cosine(query, problem)
FULL_TEXT_SHARE = 0.6
DEFERRED = ("embedding", "problem_embedding", "search_vector")
SCOPE_PRIORITY = {ExperienceScope.USER: 1.0, ExperienceScope.TENANT: 0.5}
# A pending experience (no vector yet) found by full text enters a context with its saturated
# text score, ts_rank / (ts_rank + 0.5), standing in for the similarity.
PENDING_SIMILARITY_FACTOR = 1.0


@dataclass(frozen=True)
class RetrievedMemory:
    experience_id: str  # public id
    text: str  # what goes into the prompt
    score: float  # 0.5·similarity + 0.3·confidence + 0.2·scope priority (plus feedback)
    similarity: float
    confidence: float
    scope_priority: float
    agent: str = ""  # who recorded it (empty: a key bound to no agent)
    session: str | None = None  # the session it was distilled from, if any


@dataclass
class SearchResult:
    hits: list[SearchHit]  # kind "experience", each with its row
    plan: dict[str, Any]
    warnings: list[str]


class AnyLexemeQuery(SearchQuery):
    """An OR tsquery over the English lexemes of a text, built inside PostgreSQL (no round trip).

    `plainto_tsquery` ANDs every word, so a question phrased differently from the stored text
    would match nothing; any shared lexeme matching, ranked by ts_rank, is what hybrid search needs.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text, config=FULL_TEXT_CONFIG)
        self.text = text

    def as_sql(  # type: ignore[override]
        self,
        compiler: Any,
        connection: Any,
        function: str | None = None,
        template: str | None = None,
        **extra: Any,
    ) -> tuple[str, list[Any]]:
        # Lexemes are quoted for the tsquery parser; quotes and backslashes in them are dropped.
        sql = (
            "(SELECT string_agg(chr(39) || translate(lexeme, chr(39) || chr(92), '') || chr(39), ' | ') "
            "FROM unnest(tsvector_to_array(to_tsvector(%s::regconfig, %s))) AS lexeme)::tsquery"
        )
        return sql, [FULL_TEXT_CONFIG, self.text]  # a list: Django's lookups concatenate it


_hnsw_configured: weakref.WeakSet[Any] = weakref.WeakSet()


def hnsw_connection_configure(sender: Any, connection: Any, **kwargs: Any) -> None:
    """`connection_created`: a new connection (or one checked out of the pool) gets the HNSW
    settings once, in autocommit, before any transaction: a rollback cannot undo them and no
    search has to repeat them (`configure_hnsw` below is then a no-op)."""
    raw = connection.connection
    if connection.vendor != "postgresql" or raw is None or raw in _hnsw_configured:
        return
    with connection.cursor() as cursor:
        cursor.execute(f"SET hnsw.iterative_scan = relaxed_order; SET hnsw.ef_search = {HNSW_EF_SEARCH}")
    _hnsw_configured.add(raw)


def configure_hnsw() -> None:
    """HNSW search settings for filtered top-k queries, on every connection a search may read
    (the primary, and the replica when this block reads from it).

    Filters (tenant, scope, visibility) apply after the index scan: without iterative scans
    (pgvector >= 0.8) a scan returns the ef_search nearest rows of the whole table, and a tenant
    whose rows are not among them gets fewer results than it has, or none. Set once per
    connection when it runs in autocommit (a session setting, nothing can undo it). Inside a
    transaction, a session SET would be undone if that transaction rolls back, so there it is
    `SET LOCAL`, one round trip per search, until the connection has been set outside one.
    """
    for alias in dict.fromkeys((DEFAULT_DB_ALIAS, read_alias())):
        db = connections[alias]
        db.ensure_connection()
        raw = db.connection
        if raw is None or raw in _hnsw_configured:
            continue
        scope = "LOCAL " if db.in_atomic_block else ""
        with db.cursor() as cursor:
            cursor.execute(
                f"SET {scope}hnsw.iterative_scan = relaxed_order; "
                f"SET {scope}hnsw.ef_search = {HNSW_EF_SEARCH}"
            )
        if not db.in_atomic_block:
            _hnsw_configured.add(raw)


def experiences_visible(
    *,
    tenant: Tenant,
    user_id: str | None = None,
    include_superseded: bool = False,
    as_of: datetime | None = None,
    kind: str | None = None,
    agent: str | None = None,
    shared_only: bool = False,
    readable: Q | None = None,
) -> QuerySet[Experience]:
    """The experiences a search sees, by the one visibility rule of experiences/reads.py (active
    rows; tenant-wide ones plus `user_id`'s own), narrowed to `kind`, to `agent`'s records, or
    (`shared_only`: a search not on behalf of a user) to the tenant-wide ones, and to `readable`
    (a build's reader: memory/services/sharing.py). Read-only."""
    base = (
        Experience.objects.filter(tenant=tenant)
        .filter(visible_filter(include_superseded=include_superseded, as_of=as_of))
        .filter(scope_filter(user_id=user_id))
    )
    if shared_only:
        base = base.filter(scope=ExperienceScope.TENANT)
    if kind:
        base = base.filter(kind=kind)
    if agent:
        base = base.filter(agent=agent)
    if readable is not None:
        base = base.filter(readable)
    return base


def search_plan(
    *,
    policy: ExperiencePolicy,
    sources: list[str] | None,
    weights: dict[str, float] | None,
    fusion: str | None,
) -> dict[str, Any]:
    """The effective retrieval plan: sources, weights (policy defaults), fusion. Raises InvalidInput."""
    chosen = list(dict.fromkeys(sources or SOURCES))
    unknown = [s for s in chosen if s not in SOURCES]
    if unknown or not chosen:
        raise InvalidInput(
            f"sources must be a non-empty subset of {', '.join(SOURCES)}.",
            details={"fields": {"sources": [f"Unknown source {s!r}." for s in unknown] or ["Empty."]}},
        )
    effective = {"vector": policy.vector_weight, "text": policy.text_weight}
    for name, value in (weights or {}).items():
        if name not in SOURCES or value < 0:
            raise InvalidInput(
                "weights maps a source (vector, text) to a number >= 0.",
                details={"fields": {"weights": [f"Bad weight {name!r}."]}},
            )
        effective[name] = float(value)
    fusion = fusion or "zscore"
    if fusion not in FUSIONS:
        raise InvalidInput("fusion is zscore or minmax.", details={"fields": {"fusion": ["Unknown."]}})
    return {"sources": chosen, "weights": {s: effective[s] for s in chosen}, "fusion": fusion}


def experiences_search(
    *,
    tenant: Tenant,
    query: str,
    user_id: str | None = None,
    limit: int = 10,
    sources: list[str] | None = None,
    weights: dict[str, float] | None = None,
    fusion: str | None = None,
    include_superseded: bool = False,
    as_of: datetime | None = None,
    kind: str | None = None,
    agent: str | None = None,
    readable: Q | None = None,
    query_vector: QueryEmbedding | None = None,
) -> SearchResult:
    """Hybrid search of the tenant's experiences (optionally also one user's own; `agent`: only
    those that agent recorded). Read-only.

    Each hit carries its score and each source's contribution. When the embedder is down the
    vector source is skipped with a warning (full text still answers). Raises InvalidInput.
    """
    policy = ExperiencePolicy.for_tenant(tenant)
    plan = search_plan(policy=policy, sources=sources, weights=weights, fusion=fusion)
    warnings: list[str] = []
    base = experiences_visible(
        tenant=tenant,
        user_id=user_id,
        include_superseded=include_superseded,
        as_of=as_of,
        kind=kind,
        agent=agent,
        readable=readable,
    )
    vector = None
    if "vector" in plan["sources"] and query_vector is not None and query_vector.query == query:
        vector = query_vector.get()  # the context build's one embedding of its query
        if vector is None:
            warnings.append("vector search skipped: the embedder is unavailable")
    elif "vector" in plan["sources"]:
        try:
            _, vector = embed_query(query)
        except EmbedderError as exc:
            warnings.append(f"vector search skipped: {exc}")
            logger.warning("vector search skipped: %s", exc)
    tsquery = AnyLexemeQuery(query) if "text" in plan["sources"] else None
    per_source = max(CANDIDATES_PER_SOURCE, limit * 2)
    signals = search_candidates(base=base, vector=vector, tsquery=tsquery, per_source=per_source)
    if not signals:
        return SearchResult([], plan, warnings)
    objects = Experience.objects.select_related(
        "merged_into", "superseded_by", "source_task", "source_session"
    ).defer(
        # Vectors are large and parsed in Python; the cosines came from PostgreSQL.
        *DEFERRED,
        *(f"{rel}__{name}" for rel in ("merged_into", "superseded_by") for name in DEFERRED),
    )
    by_pk = objects.in_bulk(list(signals))
    ranked = ranking.rank(
        query=query, candidates=[_candidate(by_pk[pk], row) for pk, row in signals.items() if pk in by_pk],
        plan=_ranking_plan(plan),
    )  # fmt: skip
    hits = [
        _hit(by_pk[int(item.candidate.key)], item=item, signals=signals[int(item.candidate.key)], plan=plan)
        for item in ranked[:limit]
    ]
    return SearchResult(hits, plan, warnings)


def _similarity(row: dict[str, Any]) -> float | None:
    """0.6 · cosine to the whole experience + 0.4 · cosine to its problem; None without a vector."""
    if row.get("distance") is None:
        return None
    similarity = 1.0 - float(row["distance"])
    if row.get("problem_distance") is not None:
        problem_similarity = 1.0 - float(row["problem_distance"])
        similarity = FULL_TEXT_SHARE * similarity + (1.0 - FULL_TEXT_SHARE) * problem_similarity
    return similarity


def _candidate(experience: Experience, row: dict[str, Any]) -> ranking.Candidate:
    return ranking.Candidate(
        key=str(experience.pk), kind="experience", text=experience.text, group=None, position=None,
        occurred_at=experience.created_at, dense=_similarity(row),
    )  # fmt: skip


def _ranking_plan(plan: dict[str, Any]) -> ranking.Plan:
    """The ranker's plan for this search's sources and weights: no neighbours, no length prior."""
    weights = plan["weights"]
    return ranking.Plan(
        dense_weight=weights.get("vector", 0.0), lexical_weight=weights.get("text", 0.0),
        fusion=plan["fusion"], neighbour_weight=0.0, length_weight=0.0,
    )  # fmt: skip


def _hit(
    row: Experience, *, item: ranking.Ranked, signals: dict[str, Any], plan: dict[str, Any]
) -> SearchHit:
    """An experience as a search hit: its score and each source's contribution (`vector`, `text`:
    the ranker's dense and lexical parts); `similarity` is None while the row has no vector;
    `text_score` its full-text rank saturated to 0..1 (what a pending row enters a context with)."""
    parts = item.contributions
    contributions = {
        name: parts[part]
        for name, part in (("vector", "dense"), ("text", "lexical"))
        if name in plan["sources"]
    }
    raw_rank = float(signals.get("rank") or 0.0)
    similarity = _similarity(signals)
    return SearchHit(
        kind="experience", id=row.public_id, text=row.text, score=item.score, relevance=item.score,
        contributions=contributions, similarity=None if similarity is None else round(similarity, 6),
        occurred_at=row.created_at, experience=row,
        text_score=round(raw_rank / (raw_rank + TEXT_RANK_HALF), 6),
    )  # fmt: skip


def memory_rank(*, hit: SearchHit, policy: ExperiencePolicy) -> RetrievedMemory:
    """The context slot score: 0.5·similarity + 0.3·confidence + 0.2·scope priority + feedback."""
    experience = hit.experience
    assert experience is not None  # an experiences search's hit carries its row
    similarity = hit.similarity if hit.similarity is not None else PENDING_SIMILARITY_FACTOR * hit.text_score
    similarity = max(0.0, similarity)
    scope_priority = SCOPE_PRIORITY.get(ExperienceScope(experience.scope), 0.5)
    votes = experience.helpful_count - experience.unhelpful_count
    feedback = policy.helpful_weight * votes / (experience.helpful_count + experience.unhelpful_count + 1)
    score = 0.5 * similarity + 0.3 * experience.confidence + 0.2 * scope_priority + feedback
    return RetrievedMemory(
        experience_id=experience.public_id,
        text=experience.text,
        score=round(score, 6),
        similarity=round(similarity, 6),
        confidence=experience.confidence,
        scope_priority=scope_priority,
        agent=experience.agent,
        session=experience.source_session.public_id if experience.source_session else None,
    )


def experiences_for_context(
    *,
    tenant: Any,
    session: Any,
    query: str,
    limit: int,
    max_chars: int,
    query_vector: QueryEmbedding | None = None,
) -> list[RetrievedMemory]:
    """The best experiences for `query`, at most `limit`, their texts within `max_chars` in total.

    Read-only. Candidates come from hybrid search in the tenant plus the session user's own
    memories, only those the session's agent recorded unless the tenant shares more
    (sharing.py); those less similar than policy.context_min_similarity are left out; the rest
    are ranked by `memory_rank` and packed greedily (an experience that does not fit is skipped,
    a smaller one after it may still fit).
    """
    if not query.strip() or limit <= 0 or max_chars <= 0:
        return []
    policy = ExperiencePolicy.for_tenant(tenant)
    result = experiences_search(
        tenant=tenant,
        query=query,
        user_id=session.user_id or "",
        limit=max(20, limit * 4),
        readable=sharing.experience_reader_filter(tenant=tenant, agent=session.agent.external_id),
        query_vector=query_vector,
    )
    ranked = [memory_rank(hit=hit, policy=policy) for hit in result.hits]
    ranked = [m for m in ranked if m.similarity >= policy.context_min_similarity]
    ranked.sort(key=lambda m: -m.score)
    chosen: list[RetrievedMemory] = []
    used = 0
    for memory in ranked:
        if len(chosen) >= limit:
            break
        if used + len(memory.text) > max_chars:
            continue
        chosen.append(memory)
        used += len(memory.text)
    return chosen


def experiences_mark_used(*, tenant: Any, experience_ids: list[str]) -> None:
    """Count a use of each experience (use count + 1, last used = now). Foreign ids are ignored."""
    experiences_touch(tenant=tenant, experience_ids=experience_ids)


def search_candidates(
    *, base: Any, vector: np.ndarray | None, tsquery: Any, per_source: int
) -> dict[int, dict[str, Any]]:
    """The candidates of both sources among `base` (experiences_visible): pk → signals, each
    ("distance", "problem_distance", "rank") computed once, where it is cheap. The one experience
    pool of experiences search, memory search and context recall."""
    signals: dict[int, dict[str, Any]] = {}
    if vector is not None:
        configure_hnsw()
        nearest = (
            base.filter(embedding__isnull=False)
            .annotate(
                distance=CosineDistance("embedding", vector),
                problem_distance=CosineDistance("problem_embedding", vector),
            )
            .order_by("distance")
        )
        fields = ["pk", "distance", "problem_distance"]
        if tsquery is not None:
            nearest = nearest.annotate(rank=SearchRank(F("search_vector"), tsquery))
            fields.append("rank")
        for row in nearest.values(*fields)[:per_source]:
            signals[row["pk"]] = row
    if tsquery is not None:
        # Rank at most TEXT_MATCH_CAP matching rows: an OR query of common words can match
        # most of a large tenant, and ts_rank over all of them would dominate the latency.
        matching = base.filter(search_vector=tsquery).values("pk")[:TEXT_MATCH_CAP]
        ranked = (
            Experience.objects.filter(pk__in=Subquery(matching))
            .annotate(rank=SearchRank(F("search_vector"), tsquery))
            .order_by("-rank", "pk")
            .values("pk", "rank")[:per_source]
        )
        for row in ranked:
            signals.setdefault(row["pk"], {}).update(row)
    # Text-only candidates still need their cosines (they may be pending: then None).
    missing = [pk for pk, row in signals.items() if "distance" not in row]
    if vector is not None and missing:
        for row in (
            Experience.objects.filter(pk__in=missing)
            .annotate(
                distance=CosineDistance("embedding", vector),
                problem_distance=CosineDistance("problem_embedding", vector),
            )
            .values("pk", "distance", "problem_distance")
        ):
            signals[row["pk"]].update(row)
    return signals
