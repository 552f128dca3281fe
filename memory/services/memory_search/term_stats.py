"""A large tenant's word statistics, snapshotted: the document frequency of every lexeme of its
messages, read by a search over the whole tenant instead of counting the query's words.

Counting a word's rows at query time costs a heap visit per matching row (~4 ms per 1,000 at
100,000 messages, 10-16 ms per search for the words not seen in the last 5 minutes). The
snapshot (SearchTermSnapshot + SearchTermStat) is taken in one statement, so it is one MVCC
snapshot of the tenant's committed messages: a rolled-back write is never in it, a deleted
message leaves it at the next refresh. It is replaced whole (never incremented), so it cannot
drift: each count is exact as of `taken_at`.

Approximate by design, with a bound: a search uses it only while the tenant's message count
(the cached scope size) is within SNAPSHOT_DRIFT_MAX of the snapshot's and the snapshot is
younger than SNAPSHOT_MAX_AGE seconds, so no word's count is off by more than the messages
written or deleted since (≤ 10% of the tenant). Otherwise the search counts as before, and asks
for a refresh: SNAPSHOT_REFRESH_SECONDS after the last, or on a drift of SNAPSHOT_REFRESH_DRIFT,
on a thread of its own (never inside a caller's transaction); one refresher per tenant across
processes (a transaction-level advisory lock; a second one skips).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

from cachetools import TTLCache
from django.db import connection, transaction
from django.utils import timezone

from memory.models import Message, SearchTermSnapshot, SearchTermStat, Tenant
from memory.services.memory_search.sql import fetch_rows

logger = logging.getLogger(__name__)

SNAPSHOT_DRIFT_MAX = 0.10  # used while the tenant's messages differ from the snapshot's by at most this share
SNAPSHOT_MAX_AGE = 3_600.0  # ... and it is at most this old (seconds)
SNAPSHOT_REFRESH_SECONDS = 600.0  # a refresh is asked for once it is this old ...
SNAPSHOT_REFRESH_DRIFT = 0.02  # ... or the messages moved by this share
_LOCK_NAMESPACE = 0x63747873  # pg_try_advisory_xact_lock(namespace, tenant id)

REFRESH_ASK_SECONDS = 30.0  # a process asks for a tenant's refresh at most this often
# Tenants whose refresh this process started in the last REFRESH_ASK_SECONDS.
_asked: TTLCache[int, bool] = TTLCache(maxsize=10_000, ttl=REFRESH_ASK_SECONDS)
_asked_lock = threading.Lock()


@dataclass(frozen=True)
class Snapshot:
    messages: int
    avg_len: float
    taken_at: datetime
    df: dict[str, int | None]  # query term → rows holding it; None: ignored word; absent: count it


def snapshot_counts(*, tenant_id: int, terms: list[str], config: str, current_rows: int) -> Snapshot | None:
    """The tenant's snapshot and the query terms' rows in it (one query), or None when there is
    no snapshot within the bounds (then a refresh is asked for). A term PostgreSQL splits into
    several lexemes is left out of `df` (the caller counts it)."""
    found = fetch_rows(
        f"SELECT p.messages, p.avg_len, p.taken_at, t.term, numnode(plainto_tsquery(%s::regconfig, t.term)), "
        f"coalesce((SELECT s.rows FROM {SearchTermStat._meta.db_table} s WHERE s.tenant_id = p.tenant_id "
        "AND s.lexeme = (tsvector_to_array(to_tsvector(%s::regconfig, t.term)))[1]), 0) "
        f"FROM {SearchTermSnapshot._meta.db_table} p, unnest(%s::text[]) t(term) WHERE p.tenant_id = %s",
        [config, config, terms, tenant_id],
    )
    if not found:
        refresh_ask(tenant_id)
        return None
    messages, avg_len, taken_at = int(found[0][0]), float(found[0][1]), found[0][2]
    age = (timezone.now() - taken_at).total_seconds()
    drift = abs(current_rows - messages) / max(1, current_rows)
    if age > SNAPSHOT_REFRESH_SECONDS or drift > SNAPSHOT_REFRESH_DRIFT:
        refresh_ask(tenant_id)
    if age > SNAPSHOT_MAX_AGE or drift > SNAPSHOT_DRIFT_MAX:
        return None
    df: dict[str, int | None] = {}
    for row in found:
        term, nodes, rows = row[3], int(row[4]), int(row[5])
        if nodes == 0:
            df[term] = None
        elif nodes == 1:
            df[term] = rows
    return Snapshot(messages=messages, avg_len=avg_len, taken_at=taken_at, df=df)


def term_stats_refresh(tenant: Tenant | int) -> bool:
    """Take the tenant's word statistics again, in one transaction; False when another refresh of
    the tenant holds the lock (it will have the same result)."""
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    stats, snapshots, messages = (
        SearchTermStat._meta.db_table,
        SearchTermSnapshot._meta.db_table,
        Message._meta.db_table,
    )
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_LOCK_NAMESPACE, tenant_id])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(f"DELETE FROM {stats} WHERE tenant_id = %s", [tenant_id])
        # One statement, one MVCC snapshot: the counts and the message total agree.
        cursor.execute(
            f"WITH words AS (INSERT INTO {stats} (tenant_id, lexeme, rows) "
            f"SELECT %s, u.lexeme, count(*) FROM {messages} m, unnest(m.search_vector) u "
            "WHERE m.tenant_id = %s GROUP BY u.lexeme RETURNING 1) "
            f"INSERT INTO {snapshots} (tenant_id, messages, avg_len, taken_at) "
            "SELECT %s, count(*), coalesce(avg(length(m.search_vector)), 0), now() "
            f"FROM {messages} m WHERE m.tenant_id = %s "
            "ON CONFLICT (tenant_id) DO UPDATE SET messages = excluded.messages, "
            "avg_len = excluded.avg_len, taken_at = excluded.taken_at",
            [tenant_id, tenant_id, tenant_id, tenant_id],
        )
    return True


def refresh_ask(tenant_id: int) -> None:
    """Refresh the tenant's snapshot on a thread of its own (at most once per REFRESH_ASK_SECONDS
    per tenant and process; another process's refresh of it makes this one skip at once).
    Not from inside a caller's transaction: the thread's connection would not see its writes."""
    if connection.in_atomic_block:
        return
    with _asked_lock:
        if tenant_id in _asked:
            return
        _asked[tenant_id] = True
    threading.Thread(target=_refresh_run, args=(tenant_id,), name="term-stats", daemon=True).start()


def _refresh_run(tenant_id: int) -> None:
    try:
        term_stats_refresh(tenant_id)
    except Exception:
        logger.exception("memory search: the word statistics of tenant %s were not refreshed", tenant_id)
    finally:
        connection.close()
