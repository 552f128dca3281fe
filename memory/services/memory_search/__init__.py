"""Memory search: messages, summaries, facts, experiences and user memories of a scope, ranked for a query.

One engine for every scope size. The message pool (ranking.py's contract) is one statement over
PostgreSQL's indexes: the top POOL_LEXICAL rows by full text (an OR of the query's words, GIN,
ts_rank_cd), the top POOL_DENSE by cosine (pgvector), the turns within ±POOL_NEIGHBOURS of the
best POOL_NEIGHBOUR_SEEDS of each list. BM25's statistics are the pool's own: nothing of a scope
is cached or estimated per process. Summaries, facts, experiences and user memories are pooled
only for the kinds the scope holds rows of (one statement says which). `ranking.rank` scores the
union, every kind alike; we cut to `limit`.

Scope: a session (only it, or every session of its user — or of its agent when it has no user),
a user's sessions, an agent's sessions (optionally one user's), or the whole tenant. Every query
is filtered by the tenant; an unknown or foreign session or agent is NotFound. The scope is
resolved once (`scope.scope_sessions`) into the session pks every query of the search filters by
(`sql.ScopeWhere`). Agent-private context (memory.services.layers) is never searched;
experiences are the tenant's shared ones plus the scope user's own.

The package is layered, every import at module top, each module importing only those before it:
`scope` (SearchScope, scope_sessions, validation) and `sql` (the scope's WHERE clause) →
`digests`, `user_memories` → `candidates` (message pool, kinds present, summaries, facts,
experiences) → `results` (hits, neighbours) → `search` (memory_search, which embeds the query on a
thread of its own meanwhile). The names callers use are re-exported here.
"""

from memory.services.memory_search.results import SearchHit, SearchResult, message_id
from memory.services.memory_search.scope import (
    KINDS,
    MAX_LIMIT,
    MAX_NEIGHBOURS,
    SESSIONS_CHOICES,
    SearchScope,
    plan_parse,
    scope_sessions,
)
from memory.services.memory_search.search import memory_search

__all__ = [
    "KINDS",
    "MAX_LIMIT",
    "MAX_NEIGHBOURS",
    "SESSIONS_CHOICES",
    "SearchHit",
    "SearchResult",
    "SearchScope",
    "memory_search",
    "message_id",
    "plan_parse",
    "scope_sessions",
]
