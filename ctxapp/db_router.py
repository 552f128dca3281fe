"""Reads from a streaming replica (DATABASE_REPLICA_URL), writes and read-your-writes on the primary.

The rule, in one place:

- Only code inside `replica_reads()` may read from the replica: memory search, the reads of a
  context build (history, recall) and dashboard pages (GET/HEAD). Everything else reads the
  primary, as it does without a replica.
- Only inside an HTTP request (`RequestWritesMiddleware`): a worker, a command or an in-process
  caller has no record of what it wrote, so its reads stay on the primary.
- Not after the request wrote: the middleware watches the statements the request sends to the
  primary (Django's `execute_wrapper`); after the first INSERT/UPDATE/DELETE the request reads
  the primary for the rest of its life, so it always sees its own writes. Inside a transaction
  on the primary every read stays there too.
- Not while the replica is behind by more than CTXAPP_REPLICA_MAX_LAG_SECONDS, or unreachable:
  `replica_health()` measures the lag (primary WAL position against the replica's replayed one)
  at most once a second per process; /readyz reports it.

What a replica read may miss is another request's write of the last lag-bound seconds at most
(docs/production.md, Read replica).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

REPLICA = "replica"
# How long one lag measurement is trusted. Short against the lag bound (seconds), long against a
# request (milliseconds): one probe per process and second, whatever the request rate.
HEALTH_MAX_AGE_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 1


def replica_configured() -> bool:
    return REPLICA in settings.DATABASES


# --- which requests wrote ------------------------------------------------------------------------
@dataclass
class _RequestWrites:
    wrote: bool = False


_request: ContextVar[_RequestWrites | None] = ContextVar("ctxapp_request_writes", default=None)
_reading_from: ContextVar[str] = ContextVar("ctxapp_read_alias", default=DEFAULT_DB_ALIAS)

_WRITE_STATEMENT = re.compile(r"\s*(INSERT|UPDATE|DELETE|MERGE|COPY|TRUNCATE|CREATE|ALTER|DROP)\b", re.I)
_WITH_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b", re.I)


def _cache_tables() -> tuple[str, ...]:
    """Tables of Django's database cache: the throttles' counters there are no data a read of the
    same request looks for, so writing them does not pin the request to the primary."""
    return tuple(
        str(cache["LOCATION"])
        for cache in settings.CACHES.values()
        if str(cache.get("BACKEND", "")).endswith("db.DatabaseCache")
    )


def statement_writes(sql: str, ignored_tables: tuple[str, ...] = ()) -> bool:
    """Whether `sql` may change rows (a CTE with a data-modifying part included)."""
    head = sql[:16].lstrip().upper()
    if head.startswith("WITH"):
        writes = _WITH_WRITE.search(sql) is not None
    else:
        writes = _WRITE_STATEMENT.match(sql) is not None
    return writes and not any(f'"{table}"' in sql for table in ignored_tables)


def _is_cache(model: type[Any]) -> bool:
    """Django's database cache asks the router with its own model class for its table."""
    return str(model._meta.db_table) in _cache_tables()


@contextmanager
def request_writes_tracked() -> Iterator[None]:
    """Record, for the code run inside, whether it wrote to the primary."""
    state = _RequestWrites()
    ignored = _cache_tables()

    def note_writes(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if not state.wrote and statement_writes(sql, ignored):
            state.wrote = True
        return execute(sql, params, many, context)

    token = _request.set(state)
    try:
        with connections[DEFAULT_DB_ALIAS].execute_wrapper(note_writes):
            yield
    finally:
        _request.reset(token)


class RequestWritesMiddleware:
    """Installed only with DATABASE_REPLICA_URL. Tracks the request's writes (see the module doc)
    and runs dashboard pages (GET/HEAD outside /api/ and /admin/) inside `replica_reads()`.

    Synchronous only, like the middleware after it: under ASGI the request's middleware and view
    then run on one thread, the one whose primary connection the write tracking watches."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with request_writes_tracked():
            if request.method in ("GET", "HEAD") and _is_dashboard_page(request.path):
                # The session and its user are read from the primary first: a login that just
                # happened may not have reached the replica yet.
                user = getattr(request, "user", None)
                if user is not None:
                    user.is_authenticated  # noqa: B018 (evaluates the lazy user on the primary)
                with replica_reads():
                    return self.get_response(request)
            return self.get_response(request)


_NOT_DASHBOARD = ("/api/", "/admin/", "/healthz", "/readyz", "/metrics", "/static/", "/login/", "/logout/")


def _is_dashboard_page(path: str) -> bool:
    return not path.startswith(_NOT_DASHBOARD)


# --- where a read goes ---------------------------------------------------------------------------
# Reads each decision sent where, per process (/readyz shows them).
reads_routed: Counter[str] = Counter()


def _decide() -> tuple[str, str]:
    if not replica_configured():
        return DEFAULT_DB_ALIAS, "no_replica"
    state = _request.get()
    if state is None:
        return DEFAULT_DB_ALIAS, "outside_request"
    if state.wrote:
        return DEFAULT_DB_ALIAS, "request_wrote"
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        return DEFAULT_DB_ALIAS, "in_transaction"
    if not replica_health().usable:
        return DEFAULT_DB_ALIAS, "replica_unusable"
    return REPLICA, "replica"


@contextmanager
def replica_reads() -> Iterator[str]:
    """Let the reads inside go to the replica when the rule above allows it; yields the alias.

    The ORM follows it through `ReplicaRouter`; raw SQL asks `read_alias()`. A replica that fails
    a read inside is marked unusable at once, so the next reads go to the primary (this one fails)."""
    alias, reason = _decide()
    if replica_configured():
        reads_routed[reason] += 1
    token = _reading_from.set(alias)
    try:
        yield alias
    except (OperationalError, InterfaceError) as exc:
        if alias == REPLICA:
            _health.mark_unusable(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        _reading_from.reset(token)


def read_alias() -> str:
    """The database alias reads should use here: the replica only inside an allowing `replica_reads()`,
    and only until the request writes (a write inside the block pins the rest of it too)."""
    alias = _reading_from.get()
    if alias == REPLICA:
        state = _request.get()
        if state is not None and state.wrote:
            return DEFAULT_DB_ALIAS
    return alias


class ReplicaRouter:
    """Django's router for the replica alias: reads as `read_alias()` says, everything else on the primary."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str:
        if _is_cache(model):  # the rate limits count on the primary, whatever the request reads
            return DEFAULT_DB_ALIAS
        return read_alias()

    def db_for_write(self, model: type[Any], **hints: Any) -> str:
        state = _request.get()
        if state is not None and not _is_cache(model):
            state.wrote = True
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # one database, two servers

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS


# --- how far behind the replica is ---------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaHealth:
    reachable: bool
    lag_seconds: float | None = None
    lag_bytes: int | None = None
    replay_paused: bool = False
    error: str = ""
    max_lag_seconds: float = 0.0
    measured_at: float = field(default_factory=time.monotonic)

    @property
    def usable(self) -> bool:
        return self.reachable and self.lag_seconds is not None and self.lag_seconds <= self.max_lag_seconds

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.usable,
            "lag_seconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
            "lag_bytes": self.lag_bytes,
            "max_lag_seconds": self.max_lag_seconds,
            "reads": dict(reads_routed),
        }
        if self.replay_paused:
            out["replay_paused"] = True
        if self.error:
            out["error"] = self.error
        elif not self.usable:
            out["error"] = f"replica {self.lag_seconds:.1f} s behind (bound {self.max_lag_seconds:g} s)"
        return out


def _lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


class _HealthProbe:
    """Measures the replica's lag on its own connection (a stopped replica refuses at once, a
    hanging one costs PROBE_TIMEOUT_SECONDS), at most once per HEALTH_MAX_AGE_SECONDS; one
    thread measures while the others use the last measurement."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._last: ReplicaHealth | None = None

    def current(self, *, fresh: bool = False) -> ReplicaHealth:
        last = self._last
        if not fresh and last is not None and time.monotonic() - last.measured_at < HEALTH_MAX_AGE_SECONDS:
            return last
        if not self._lock.acquire(blocking=fresh or last is None):
            return last if last is not None else ReplicaHealth(reachable=False, error="not measured yet")
        try:
            self._last = self._measure()
            return self._last
        finally:
            self._lock.release()

    def forget(self) -> None:
        with self._lock:
            self._close()
            self._last = None

    def mark_unusable(self, error: str) -> None:
        self._last = ReplicaHealth(
            reachable=False, error=error, max_lag_seconds=settings.CTXAPP.replica_max_lag_seconds
        )

    def _measure(self) -> ReplicaHealth:
        bound = settings.CTXAPP.replica_max_lag_seconds
        try:
            # The primary's position first: the replica, read after, can only be nearer to it.
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                cursor.execute("SELECT pg_current_wal_lsn()::text")
                primary_lsn = _lsn(cursor.fetchone()[0])
            row = self._replica_row()
        except (psycopg.Error, OperationalError, InterfaceError) as exc:
            self._close()
            return ReplicaHealth(
                reachable=False, error=f"{type(exc).__name__}: {exc}".strip(), max_lag_seconds=bound
            )
        in_recovery, replay_lsn, replay_age, paused = row
        if not in_recovery:
            return ReplicaHealth(
                reachable=True, error="the replica is not in recovery (promoted?)", max_lag_seconds=bound
            )
        behind = max(0, primary_lsn - _lsn(replay_lsn)) if replay_lsn else None
        if behind == 0:
            lag: float | None = 0.0
        else:
            # Behind: as old as the last transaction it replayed (none yet: unknown, so unusable).
            lag = None if replay_age is None else max(0.0, float(replay_age))
        return ReplicaHealth(
            reachable=True,
            lag_seconds=lag,
            lag_bytes=behind,
            replay_paused=bool(paused),
            max_lag_seconds=bound,
        )

    def _replica_row(self) -> tuple[Any, ...]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                settings.CTXAPP.database_replica_url, autocommit=True, connect_timeout=PROBE_TIMEOUT_SECONDS
            )
        row = self._conn.execute(
            "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text,"
            " EXTRACT(EPOCH FROM clock_timestamp() - pg_last_xact_replay_timestamp()),"
            " pg_is_in_recovery() AND pg_is_wal_replay_paused()"
        ).fetchone()
        assert row is not None
        return tuple(row)

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error as exc:
                logger.debug("closing the replica probe connection: %s", exc)
            self._conn = None


_health = _HealthProbe()


def replica_health(*, fresh: bool = False) -> ReplicaHealth:
    """The replica's last measured lag (`fresh`: measured now). Read-only on both servers."""
    return _health.current(fresh=fresh)


def replica_health_forget() -> None:
    """Close the probe's connection and drop its last measurement (the next read measures again)."""
    _health.forget()
