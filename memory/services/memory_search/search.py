"""memory_search: validate, resolve the scope, gather candidates, rank, cut, attach neighbours."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from itertools import islice

import numpy as np

from memory.exceptions import InvalidInput
from memory.models import Tenant
from memory.services import ranking, relevance_floor
from memory.services.embedding import EmbedderError, embed_query
from memory.services.memory_search.candidates import kinds_present, message_pool, other_candidates
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
    min_similarity: float | None = None,
    as_of: datetime | None = None,
    query_vector: np.ndarray | None = None,
) -> SearchResult:
    """Search the scope's conversational memory for `query`; best first, at most `limit` hits.

    Read-only. Raises InvalidInput (empty query, unknown kind, limit or neighbours out of
    range) and NotFound (unknown or foreign session / agent in the scope). When the embedder is
    unavailable the dense signal is left out with a warning (words still answer).
    `exclude_messages` ((session id, seq) pairs) are left out of the results (context recall:
    what the window already holds). The relevance floor (`relevance_floor.passes_floor`) leaves out
    every item that shares no word with the query and whose cosine to it is below
    `min_similarity` (default: the tenant's MemoryPolicy.search_min_similarity). User memories
    are the current ones, or with `as_of` those that were current at that moment.
    `query_vector`: the query's embedding when the caller has it already (a context build embeds
    its query once for recall, experiences and the profile); else it is computed here.
    """
    scope = scope or SearchScope()
    query = (query or "").strip()
    chosen = search_validate(query=query, scope=scope, kinds=kinds, limit=limit, neighbours=neighbours)
    floor_check(min_similarity)
    vector = QueryVector(query, known=query_vector)  # on its own thread while the scope's SQL runs
    session_pks, _ = scope_sessions(tenant=tenant, scope=scope)
    policy = memory_policy_get(tenant=tenant)
    config = policy.text_search_config or "english"
    floor = policy.search_min_similarity if min_similarity is None else min_similarity
    kind_set = set(chosen)
    if session_pks == []:
        kind_set -= {"message", "summary", "fact"}
    # Only the kinds the scope holds rows of cost a query (one statement tells which).
    kind_set &= {"message"} | kinds_present(tenant=tenant, kinds=kind_set, session_pks=session_pks)
    where = ScopeWhere(tenant=tenant, session_pks=session_pks, time_from=time_from, time_to=time_to)
    chosen_plan = plan or (ranking.EXPERIENCE_PLAN if kind_set == {"experience"} else ranking.DEFAULT_PLAN)
    candidates: list[ranking.Candidate] = []
    if "message" in kind_set:
        candidates = message_pool(
            where=where, query=query, vector=vector.get(), config=config, plan=chosen_plan
        )
    candidates += other_candidates(
        tenant=tenant, kinds=kind_set - {"message"}, session_pks=session_pks, scope=scope, query=query,
        vector=vector.get(), config=config, time_from=time_from, time_to=time_to, as_of=as_of,
    )  # fmt: skip
    warnings = vector.warnings()
    # One pool, one plan, whatever the kinds: a message and an experience alike in meaning and
    # words score alike, the list is sorted by that score and its contributions add up to it.
    ranked = ranking.rank(query=query, candidates=candidates, plan=chosen_plan)
    excluded = exclude_messages or set()
    kept = (
        item
        for item in ranked
        if not (
            item.candidate.kind == "message" and (item.candidate.group, item.candidate.position) in excluded
        )
        and relevance_floor.passes_floor(query=query, candidate=item.candidate, min_similarity=floor)
    )
    hits = [hit_from_ranked(item, score=item.score) for item in islice(kept, limit)]
    if neighbours:
        neighbours_attach(tenant=tenant, hits=hits, radius=neighbours)
    return SearchResult(
        query=query, results=hits, plan=chosen_plan, warnings=warnings, candidates=len(candidates)
    )


def floor_check(min_similarity: float | None) -> None:
    """Raises InvalidInput unless `min_similarity` is None or a cosine (-1..1)."""
    if min_similarity is None:
        return
    if (
        isinstance(min_similarity, bool)
        or not isinstance(min_similarity, int | float)
        or not (-1.0 <= min_similarity <= 1.0)
    ):
        raise InvalidInput(
            "min_similarity must be a number between -1 and 1.",
            details={"fields": {"min_similarity": ["Must be a number between -1 and 1."]}},
        )


class QueryVector:
    """The query's embedding, computed on a thread of its own from the start of a search: the
    model (onnxruntime) releases the GIL, so it overlaps the scope's SQL and the lexical pool.
    `get()` waits for it: the unit vector, or None when the embedder is unavailable. The threads
    are kept (starting one cost ~1 ms of a search's wall time on a busy machine)."""

    def __init__(self, query: str, *, known: np.ndarray | None = None) -> None:
        self._known = known
        self._future = None if known is not None else _embedding_pool().submit(embed_query, query)

    def get(self) -> np.ndarray | None:
        if self._future is None:
            return self._known
        try:
            return self._future.result()[1]
        except EmbedderError:
            return None

    def warnings(self) -> list[str]:
        if self._future is None:
            return []
        error = self._future.exception()
        if isinstance(error, EmbedderError):
            return [f"The embedder is unavailable ({error}); results are ranked by words only."]
        return []


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
