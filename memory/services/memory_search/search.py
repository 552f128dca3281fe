"""memory_search: validate, resolve the scope, gather candidates, rank, cut, attach neighbours."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from itertools import islice, zip_longest

import numpy as np
from django.utils import timezone

from memory.models import Tenant
from memory.services import ranking
from memory.services.embedding import EmbedderError, embed_query
from memory.services.memory_search.candidates import other_candidates, scope_message_candidates
from memory.services.memory_search.results import SearchResult, hit_from_ranked, neighbours_attach
from memory.services.memory_search.scope import SearchScope, scope_sessions, search_validate
from memory.services.memory_search.sql import ScopeWhere
from memory.services.message_indexing import memory_policy_get


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
    chosen = search_validate(query=query, scope=scope, kinds=kinds, limit=limit, neighbours=neighbours)
    plan_given = plan is not None
    plan = plan or ranking.DEFAULT_PLAN
    session_pks, _ = scope_sessions(tenant=tenant, scope=scope)
    vector = QueryVector(query)  # embedded on its own thread while the scope's SQL runs
    config = memory_policy_get(tenant=tenant).text_search_config or "english"
    kind_set = set(chosen)
    if session_pks == []:
        kind_set -= {"message", "summary", "fact"}
    where = ScopeWhere(tenant=tenant, session_pks=session_pks, time_from=time_from, time_to=time_to)
    candidates: list[ranking.Candidate] = []
    stats = ranking.CorpusStats(n_docs=0, avg_len=0.0)
    if "message" in kind_set:
        candidates, stats = scope_message_candidates(
            where=where, query=query, vector=vector.get, config=config, plan=plan
        )
    candidates += other_candidates(
        tenant=tenant, kinds=kind_set, session_pks=session_pks, scope=scope, query=query,
        vector=vector.get(), config=config, time_from=time_from, time_to=time_to,
    )  # fmt: skip
    warnings = vector.warnings()
    ranked = _rank_by_kind(
        query=query, candidates=candidates, stats=stats, plan=plan, experience_plan_given=plan_given
    )
    excluded = exclude_messages or set()
    kept = (
        (item, score)
        for item, score in ranked
        if not (
            item.candidate.kind == "message" and (item.candidate.group, item.candidate.position) in excluded
        )
    )
    hits = [hit_from_ranked(item, score=score) for item, score in islice(kept, limit)]
    if neighbours:
        neighbours_attach(tenant=tenant, hits=hits, radius=neighbours)
    return SearchResult(query=query, results=hits, plan=plan, warnings=warnings, candidates=len(candidates))


class QueryVector:
    """The query's embedding, computed on a thread of its own from the start of a search: the
    model (onnxruntime) releases the GIL, so it overlaps the scope's SQL and the lexical pool.
    `get()` waits for it: the unit vector, or None when the embedder is unavailable. The threads
    are kept (starting one cost ~1 ms of a search's wall time on a busy machine)."""

    def __init__(self, query: str) -> None:
        self._future = _embedding_pool().submit(embed_query, query)

    def get(self) -> np.ndarray | None:
        try:
            return self._future.result()[1]
        except EmbedderError:
            return None

    def warnings(self) -> list[str]:
        error = self._future.exception()
        if isinstance(error, EmbedderError):
            return [f"The embedder is unavailable ({error}); results are ranked by words only."]
        return []


MERGED_RANK_K = 60  # a merged list's score is 1 / (MERGED_RANK_K + rank in its pool), as in RRF
QUERY_EMBEDDING_THREADS = 4  # concurrent searches of one process embedding their queries at once
_embedding_pools: dict[int, ThreadPoolExecutor] = {}
_embedding_pools_lock = threading.Lock()


def _embedding_pool() -> ThreadPoolExecutor:
    # Threads do not survive a fork (Celery's prefork children): one pool per process.
    with _embedding_pools_lock:
        pool = _embedding_pools.get(os.getpid())
        if pool is None:
            pool = ThreadPoolExecutor(
                max_workers=QUERY_EMBEDDING_THREADS, thread_name_prefix="query-embedding"
            )
            _embedding_pools.clear()
            _embedding_pools[os.getpid()] = pool
        return pool


def _rank_by_kind(
    *,
    query: str,
    candidates: list[ranking.Candidate],
    stats: ranking.CorpusStats,
    plan: ranking.Plan,
    experience_plan_given: bool,
) -> list[tuple[ranking.Ranked, float]]:
    """Each item with its score in the list. Experiences (problem/solution texts) rank in their
    own pool under EXPERIENCE_PLAN unless the caller chose a plan; the two lists merge by rank
    (ranking.py: "rank the two kinds in separate pools and merge by rank"), conversational memory
    first on a tie."""
    conversational = [c for c in candidates if c.kind != "experience"]
    distilled = [c for c in candidates if c.kind == "experience"]
    now = timezone.now()
    ranked_lists = [ranking.rank(query=query, candidates=conversational, stats=stats, plan=plan, now=now)]
    if distilled:
        experience_plan = plan if experience_plan_given else ranking.EXPERIENCE_PLAN
        ranked_lists.append(
            ranking.rank(query=query, candidates=distilled, stats=stats, plan=experience_plan, now=now)
        )
    if len(ranked_lists) == 1:
        return [(item, item.score) for item in ranked_lists[0]]
    # Each pool's scores are on their own scale, so a merged list shows the merge's own score,
    # reciprocal rank in its pool (equal for a tie): scores never rise down the list.
    return [
        (item, round(1.0 / (MERGED_RANK_K + rank), 6))
        for rank, group in enumerate(zip_longest(*ranked_lists), start=1)
        for item in group
        if item is not None
    ]
