"""Reads a streaming replica may serve (DATABASE_REPLICA_URL), and how far behind it is.

The rule, in one place: a read goes to the replica only where its code asks for it, by name —
`.using(read_alias())` or `connections[read_alias()]` in the reads that tolerate a replica's lag
(memory search's candidate pool, experience search, the dashboard's selectors) — and then only

- outside a transaction on the primary (a transaction may have written what it reads next: it
  reads its own writes there), and
- while the replica is within CTXAPP_REPLICA_MAX_LAG_SECONDS of the primary and answers:
  `replica_health()` measures the lag (the primary's WAL position against the replica's replayed
  one) at most once a second per process; /readyz reports it. A replica read that fails marks it
  unusable at once, so the next reads go to the primary.

Everything else reads the primary, as it does without a replica: a context build's history, a
write's own reads, workers. What a replica read may miss is a write of the last lag-bound seconds
at most (docs/production.md, Read replica).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections

logger = logging.getLogger(__name__)

REPLICA = "replica"
# How long one lag measurement is trusted. Short against the lag bound (seconds), long against a
# request (milliseconds): one probe per process and second, whatever the request rate.
HEALTH_MAX_AGE_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 1

# Reads each decision sent where, per process (/readyz shows them).
reads_routed: Counter[str] = Counter()


def replica_configured() -> bool:
    return REPLICA in settings.DATABASES


def read_alias() -> str:
    """The database a lag-tolerant read should use now: the replica when the rule above allows
    it, else the primary."""
    if not replica_configured():
        return DEFAULT_DB_ALIAS
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        reads_routed["in_transaction"] += 1
        return DEFAULT_DB_ALIAS
    if not replica_health().usable:
        reads_routed["replica_unusable"] += 1
        return DEFAULT_DB_ALIAS
    reads_routed["replica"] += 1
    return REPLICA


def replica_failed(exc: BaseException) -> None:
    """A read on the replica failed: mark it unusable until the next measurement."""
    _health.mark_unusable(f"{type(exc).__name__}: {exc}")


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
