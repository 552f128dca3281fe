"""The Celery broker of the Redis-less mode: Kombu's SQLAlchemy transport, made safe to rely on.

Kombu's SQLAlchemy transport keeps messages in two tables of the PostgreSQL ctxapp already runs,
and a worker polls them. This subclass (Kombu transport `ctxsqla`, broker URL
`ctxsqla+postgresql+psycopg://…`, see ctxapp/settings.py) changes four things:

1. **Poll interval.** Kombu's is fixed at 1 s (the transport hands every transport option to
   SQLAlchemy's create_engine, which rejects `polling_interval`). This one polls every
   CTXAPP_BROKER_POLL_SECONDS (default 0.1 s): one cheap indexed query per poll, per worker.
2. **Start-up races.** Kombu creates its tables on first use, from every process that connects.
   On a fresh database the web server, the worker and the scheduler start at once, and two
   concurrent `CREATE SEQUENCE` statements collide. Here the tables are created under a
   transaction-scoped advisory lock, and a queue two processes declare at once is inserted once.
3. **Visibility timeout.** Kombu marks a taken message invisible and never shows it again, so a
   task whose worker was killed (SIGKILL, out of memory, power) was lost. Here a message taken
   more than `visibility_timeout` seconds ago and still not acknowledged is delivered again
   (CTXAPP_BROKER_VISIBILITY_TIMEOUT, the same setting Redis uses), as Redis does. Takes use
   `FOR UPDATE SKIP LOCKED`, so workers polling together never wait on each other.
4. **Acknowledged messages are deleted.** Kombu keeps every delivered message as an invisible
   row forever; here an ack (or a reject, or a requeue that re-inserts it) deletes the row, so
   the table holds only waiting and running jobs.

Figures: docs/benchmarks.md and docs/run-modes.md.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from json import loads
from queue import Empty
from typing import Any

from django.conf import settings
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import sqlalchemy as kombu_sqlalchemy
from kombu.transport.sqlalchemy.models import metadata
from kombu.utils.encoding import bytes_to_str
from sqlalchemy import delete, or_, select, text, update
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, PendingRollbackError
from sqlalchemy.orm import sessionmaker

ALIAS = "ctxsqla"
DEFAULT_POLL_SECONDS = 0.1
DEFAULT_VISIBILITY_TIMEOUT = 3600
# pg_advisory_xact_lock key for creating Kombu's tables: any fixed 64-bit number unused elsewhere.
SCHEMA_LOCK_KEY = 0x63747861_6B6F6D62  # "ctxa" "komb"


def _utcnow() -> datetime:
    # Kombu's column is a naive `timestamp`; ctxapp writes it (and compares it) in naive UTC.
    return datetime.now(UTC).replace(tzinfo=None)


class Channel(kombu_sqlalchemy.Channel):
    def __init__(self, connection: Any, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        options = connection.client.transport_options
        self.visibility_timeout = float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))
        self._rows: dict[str, int] = {}  # delivery tag -> the row it was taken from
        # Kombu's channel keeps one SQLAlchemy session, which is not thread-safe, but Celery
        # acknowledges and requeues from its result-handler thread while the consumer polls.
        self._session_lock = threading.RLock()

    def _engine_from_config(self) -> Any:
        conninfo = self.connection.client
        saved = conninfo.transport_options
        conninfo.transport_options = {k: v for k, v in saved.items() if k != "visibility_timeout"}
        try:
            return super()._engine_from_config()
        finally:
            conninfo.transport_options = saved

    def _open(self) -> Any:
        hostname = self.connection.client.hostname
        if hostname not in self._engines:
            with kombu_sqlalchemy._MUTEX:
                if hostname not in self._engines:
                    _models = (self.queue_cls, self.message_cls)  # registers them on `metadata`
                    engine = self._engine_from_config()
                    create_tables(engine)
                    self._engines[hostname] = engine, sessionmaker(bind=engine)
        return self._engines[hostname]

    def _get_or_create(self, queue: str) -> Any:
        # Kombu inserts a queue's row when it first sees the queue and only guards that with a
        # thread lock: two processes declaring the same queue together collide on its unique
        # name. The row the other process inserted is the one we want.
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        with self._session_lock:
            return super()._put(queue, payload, **kwargs)

    def _size(self, queue: str) -> int:
        with self._session_lock:
            return int(super()._size(queue))

    def _purge(self, queue: str) -> int:
        with self._session_lock:
            return int(super()._purge(queue))

    def _get(self, queue: str, timeout: Any = None) -> Any:
        with self._session_lock:
            return self._take(queue)

    def _take(self, queue: str) -> Any:
        queue_id = self._get_or_create(queue).id
        table = self.message_cls.__table__
        now = _utcnow()
        expired = now - timedelta(seconds=self.visibility_timeout)
        oldest = (
            select(table.c.id)
            .where(
                table.c.queue_id == queue_id,
                or_(table.c.visible.is_(True), table.c.timestamp < expired),
            )
            .order_by(table.c.id)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        take = (
            update(table)
            .where(table.c.id == oldest)
            .values(visible=False, timestamp=now)
            .returning(table.c.id, table.c.payload)
        )
        try:
            row = self.session.execute(take).first()
            self.session.commit()
        except Exception:
            self.session.rollback()
            raise
        if row is None:
            raise Empty()
        payload = loads(bytes_to_str(row.payload))
        self._rows[payload["properties"]["delivery_tag"]] = row.id
        return payload

    def _forget(self, delivery_tag: str) -> None:
        # Called from Celery's result-handler thread: a connection of our own, not the session.
        row_id = self._rows.pop(delivery_tag, None)
        if row_id is None:
            return
        engine, _ = self._open()
        table = self.message_cls.__table__
        with engine.begin() as conn:
            conn.execute(delete(table).where(table.c.id == row_id))

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        super().basic_ack(delivery_tag, multiple=multiple)
        self._forget(delivery_tag)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        super().basic_reject(delivery_tag, requeue=requeue)  # a requeue re-inserts it first
        self._forget(delivery_tag)

    def _restore(self, message: Any) -> None:
        super()._restore(message)  # inserted again, visible: the taken row is now a duplicate
        self._forget(message.delivery_tag)


def create_tables(engine: Any) -> None:
    """Create Kombu's queue and message tables once, however many processes start together."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        metadata.create_all(conn)


class Transport(kombu_sqlalchemy.Transport):
    Channel = Channel
    # Kombu counts only OperationalError as a lost connection. A session whose connection died
    # mid-transaction raises PendingRollbackError on its next use, and a closed one
    # InterfaceError: counted here too, Celery (worker and beat) reconnects instead of failing
    # every send after a PostgreSQL restart.
    connection_errors = (OperationalError, InterfaceError, PendingRollbackError)  # type: ignore[assignment]

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.polling_interval = poll_seconds()


def poll_seconds() -> float:
    if settings.configured and hasattr(settings, "CTXAPP"):
        return settings.CTXAPP.broker_poll_seconds
    return DEFAULT_POLL_SECONDS


TRANSPORT_ALIASES.setdefault(ALIAS, "ctxapp.infra.broker:Transport")
