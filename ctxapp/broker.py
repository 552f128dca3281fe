"""The Celery broker of the Redis-less mode: Kombu's SQLAlchemy transport, polling faster.

Kombu's SQLAlchemy transport keeps messages in two tables of the PostgreSQL ctxapp already runs,
and a worker polls them. Its poll interval is fixed at Kombu's default of 1 s (the transport
hands every transport option to SQLAlchemy's create_engine, which rejects `polling_interval`),
so a task waited up to a second before a worker saw it. This subclass polls every
CTXAPP_BROKER_POLL_SECONDS (default 0.1 s): one cheap indexed query per poll, per worker.

Kombu creates its two tables on first use, from every process that connects. On a fresh
database the web server, the worker and the scheduler all start at once, and two concurrent
`CREATE SEQUENCE` statements collide (a UniqueViolation in PostgreSQL's catalogue). This channel
creates them under a transaction-scoped advisory lock, so the first process creates them and the
others find them; likewise a queue two processes declare at once is inserted once.

Registered as the Kombu transport `ctxsqla`; the broker URL is
`ctxsqla+postgresql+psycopg://…` (see ctxapp/settings.py). Figures: docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import sqlalchemy as kombu_sqlalchemy
from kombu.transport.sqlalchemy.models import metadata
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

ALIAS = "ctxsqla"
DEFAULT_POLL_SECONDS = 0.1
# pg_advisory_xact_lock key for creating Kombu's tables: any fixed 64-bit number unused elsewhere.
SCHEMA_LOCK_KEY = 0x63747861_6B6F6D62  # "ctxa" "komb"


class Channel(kombu_sqlalchemy.Channel):
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


def create_tables(engine: Any) -> None:
    """Create Kombu's queue and message tables once, however many processes start together."""
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
        metadata.create_all(conn)


class Transport(kombu_sqlalchemy.Transport):
    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.polling_interval = poll_seconds()


def poll_seconds() -> float:
    from django.conf import settings

    if settings.configured and hasattr(settings, "CTXAPP"):
        return float(settings.CTXAPP.get("CTXAPP_BROKER_POLL_SECONDS", DEFAULT_POLL_SECONDS))
    return DEFAULT_POLL_SECONDS


TRANSPORT_ALIASES.setdefault(ALIAS, "ctxapp.broker:Transport")
