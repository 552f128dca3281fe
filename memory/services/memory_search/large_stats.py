"""BM25 statistics of a scope too large to cache (corpus.SCOPE_CORPUS_MAX): its rows and mean length,
and the document frequency of the query's rarer terms, kept for LARGE_STATS_SECONDS.

A term matching more than LARGE_TERM_CAP rows counts as common (ranking takes its idf within the
pool). Counting a term's rows exactly costs a heap visit per row (~4 ms per 1,000 at 100,000
messages), so a cached sample of the scope (TABLESAMPLE, ~5,000 rows) estimates the frequent
words: a word seen in SAMPLE_HITS_MIN sampled rows or more (about 600+ rows of 100,000) takes the
sample's estimate, every rarer word is counted exactly. Approximate statistics for huge scopes
only: a scope of at most SCOPE_CORPUS_MAX messages is ranked on exact ones (corpus.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from cachetools import TTLCache, cached
from django.db import connection

from memory.models import Message
from memory.services import ranking
from memory.services.memory_search.sql import ScopeWhere, fetch_rows, scope_key
from memory.services.memory_search.term_stats import snapshot_counts

LARGE_TERM_CAP = 5_000  # large scopes: a term matching more rows than this counts as common
LARGE_STATS_SECONDS = 300.0  # large scopes: rows, mean length, counts, sample re-measured this often
SAMPLE_ROWS = 5_000  # the scope's rows a sample aims at ...
SAMPLE_READ_MAX = 50_000  # ... reading at most about this many rows of the table
SAMPLE_ROWS_MIN = 2_000  # a smaller sample estimates nothing (every term is counted)
# A word seen in this many sampled rows or more takes the sample's estimate: relative standard
# error ~1/sqrt(30) = 18% (x1.5-2 for rows sampled by pages), i.e. its idf within ~0.2-0.4.
SAMPLE_HITS_MIN = 30

# Per process, re-measured every LARGE_STATS_SECONDS; a lock because a TTL cache mutates on reads.
_large_stats: TTLCache[tuple[Any, ...], tuple[int, float]] = TTLCache(
    maxsize=1024, ttl=LARGE_STATS_SECONDS, timer=time.monotonic
)
_large_term_counts: TTLCache[tuple[Any, ...], int | None] = TTLCache(
    maxsize=50_000, ttl=LARGE_STATS_SECONDS, timer=time.monotonic
)
_samples: TTLCache[tuple[Any, ...], tuple[list[str], list[int]]] = TTLCache(
    maxsize=1024, ttl=LARGE_STATS_SECONDS, timer=time.monotonic
)
_stats_lock = threading.Lock()


def term_counts(*, where: ScopeWhere, terms: list[str], config: str) -> dict[str, int | None]:
    """Rows matching each term, counted through the GIN index up to LARGE_TERM_CAP (None: more,
    or a word PostgreSQL's configuration ignores). Re-counted every LARGE_STATS_SECONDS, like the
    scope's size; a frequent word's rows are the sample's estimate. At most one query (plus the
    scope's size and sample, when not cached)."""
    key = (*scope_key(where), config)
    with _stats_lock:
        fresh = {t: _large_term_counts[(*key, t)] for t in terms if (*key, t) in _large_term_counts}
    missing = [t for t in terms if t not in fresh]
    if missing:
        counted = _snapshot_counts(where=where, terms=missing, config=config)
        if len(counted) < len(missing):
            sample = _sample_estimates(where=where, rows=_scope_size(where)[0])
            rest = [t for t in missing if t not in counted]
            counted.update(_term_counts_query(where=where, terms=rest, config=config, sample=sample))
        with _stats_lock:
            for term, count in counted.items():
                _large_term_counts[(*key, term)] = count
        fresh.update(counted)
    return {term: fresh[term] for term in terms}


def _snapshot_counts(*, where: ScopeWhere, terms: list[str], config: str) -> dict[str, int | None]:
    """The terms' rows from the tenant's word statistics snapshot (term_stats.py), capped like a
    count; empty when the scope is not the whole tenant or no snapshot is within its bounds."""
    if not where.whole_tenant:
        return {}
    snapshot = snapshot_counts(
        tenant_id=where.tenant_id, terms=terms, config=config, current_rows=_scope_size(where)[0]
    )
    if snapshot is None:
        return {}
    return {
        term: None if rows is None or rows > LARGE_TERM_CAP else rows for term, rows in snapshot.df.items()
    }


def _term_counts_query(
    *, where: ScopeWhere, terms: list[str], config: str, sample: tuple[list[str], list[int]]
) -> dict[str, int | None]:
    table = Message._meta.db_table
    selects, params = [], []
    # CASE and coalesce evaluate a subquery (an InitPlan) only when it is reached: an ignored word
    # and a word the sample estimates cost no scan.
    for term in terms:
        selects.append(
            "CASE WHEN numnode(plainto_tsquery(%s::regconfig, %s)) = 0 THEN NULL ELSE coalesce("
            "(SELECT e.rows FROM unnest(%s::text[], %s::int[]) e(lexeme, rows) "
            "WHERE e.lexeme = ANY(tsvector_to_array(to_tsvector(%s::regconfig, %s))) LIMIT 1), "
            f"(SELECT count(*) FROM (SELECT 1 FROM {table} m WHERE {where.where} "
            "AND m.search_vector @@ plainto_tsquery(%s::regconfig, %s) LIMIT %s) capped)) END"
        )
        params += [config, term, *sample, config, term, *where.params, config, term, LARGE_TERM_CAP + 1]
    # Under LIMIT 5001 the planner takes a sequential scan for a common word (it reads ~40,000
    # wide rows at 100k messages: 60-300 ms); the GIN bitmap finds the same rows 2-4x faster.
    # Plain SET, not SET LOCAL: LOCAL would outlive this query in a caller's transaction.
    statement = f"SELECT {', '.join(selects)}"
    with connection.cursor() as cursor:
        if isinstance(cursor.cursor, psycopg.ClientCursor):
            # Client-side binding (Django's default): the three in one round trip, run by the
            # server as one implicit transaction (an error undoes the SET with the rest).
            cursor.execute(f"SET enable_seqscan = off; {statement}; RESET enable_seqscan", params)
            cursor.cursor.nextset()
            row = cursor.fetchone()
        else:
            row = _fetch_without_seqscan(cursor, statement, params)
    return {
        term: (None if value is None or value > LARGE_TERM_CAP else int(value))
        for term, value in zip(terms, row, strict=True)
    }


def _fetch_without_seqscan(cursor: Any, statement: str, params: list[Any]) -> Any:
    cursor.execute("SET enable_seqscan = off")
    try:
        cursor.execute(statement, params)
    except Exception:
        if not connection.in_atomic_block:  # else the rollback undoes the SET
            cursor.execute("RESET enable_seqscan")
        raise
    row = cursor.fetchone()
    cursor.execute("RESET enable_seqscan")
    return row


@cached(_samples, key=lambda *, where, rows: scope_key(where), lock=_stats_lock)
def _sample_estimates(*, where: ScopeWhere, rows: int) -> tuple[list[str], list[int]]:
    """(lexemes, estimated rows) of the words seen in SAMPLE_HITS_MIN rows or more of a sample of
    the scope (`rows` rows). Empty when the sample would be smaller than SAMPLE_ROWS_MIN rows.
    TABLESAMPLE SYSTEM reads a share of the table's pages (REPEATABLE: the same ones each time)."""
    table = Message._meta.db_table
    table_rows = float(fetch_rows("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [table])[0][0])
    share = min(1.0, SAMPLE_ROWS / max(1, rows), SAMPLE_READ_MAX / max(1.0, table_rows))  # -1: never analysed
    estimates: tuple[list[str], list[int]] = ([], [])
    if share * rows >= SAMPLE_ROWS_MIN:
        # The scope's rows in the sample (lexeme NULL), then each frequent lexeme's.
        found = fetch_rows(
            f"WITH s AS (SELECT m.search_vector FROM {table} m TABLESAMPLE SYSTEM (%s) REPEATABLE (0) "
            f"WHERE {where.where}) SELECT NULL, count(*) FROM s UNION ALL "
            "SELECT u.lexeme, count(*) FROM s, unnest(s.search_vector) u "
            "GROUP BY u.lexeme HAVING count(*) >= %s",
            [100.0 * share, *where.params, SAMPLE_HITS_MIN],
        )
        sampled = next((int(n) for lexeme, n in found if lexeme is None), 0)
        if sampled >= SAMPLE_ROWS_MIN:
            frequent = [(lexeme, round(n * rows / sampled)) for lexeme, n in found if lexeme is not None]
            estimates = ([lexeme for lexeme, _ in frequent], [n for _, n in frequent])
    return estimates


@cached(_large_stats, key=scope_key, lock=_stats_lock)
def _scope_size(where: ScopeWhere) -> tuple[int, float]:
    """The scope's rows and mean lexeme count, re-measured every LARGE_STATS_SECONDS."""
    table = Message._meta.db_table
    row = fetch_rows(
        f"SELECT count(*), coalesce(avg(length(m.search_vector)), 0) FROM {table} m WHERE {where.where}",
        where.params,
    )[0]
    return int(row[0]), float(row[1])


def corpus_stats(*, where: ScopeWhere, counts: dict[str, int | None]) -> ranking.CorpusStats:
    """Statistics of a large scope: rows and mean lexeme count (re-measured every 5 minutes), the
    exact document frequency of its rarer terms; common terms are counted in the pool (ranking)."""
    rows, avg_len = _scope_size(where)
    df = {term: count for term, count in counts.items() if count is not None}
    return ranking.CorpusStats(n_docs=rows, avg_len=avg_len, df=df)
