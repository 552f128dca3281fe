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

The package is layered, every import at module top, each module importing only those before it:
`scope` (SearchScope, scope_sessions, validation) and `sql` (the scope's WHERE clause) →
`corpus` (the cached scope corpus: exact statistics and pool) and `term_stats` (a large
tenant's word statistics snapshot) → `large_stats` (a scope too large to cache: size,
snapshotted, sampled and counted term frequencies) → `candidates` (message pool,
summaries, facts, experiences) → `results` (hits, neighbours) → `search` (memory_search, which
embeds the query on a thread of its own meanwhile). The names callers use are re-exported here.
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
