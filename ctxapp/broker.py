"""The Celery broker of the Redis-less mode: Kombu's SQLAlchemy transport, polling faster.

Kombu's SQLAlchemy transport keeps messages in two tables of the PostgreSQL ctxapp already runs,
and a worker polls them. Its poll interval is fixed at Kombu's default of 1 s (the transport
hands every transport option to SQLAlchemy's create_engine, which rejects `polling_interval`),
so a task waited up to a second before a worker saw it. This subclass polls every
CTXAPP_BROKER_POLL_SECONDS (default 0.1 s): one cheap indexed query per poll, per worker.

Registered as the Kombu transport `ctxsqla`; the broker URL is
`ctxsqla+postgresql+psycopg://…` (see ctxapp/settings.py). Figures: docs/benchmarks.md.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import sqlalchemy as kombu_sqlalchemy

ALIAS = "ctxsqla"
DEFAULT_POLL_SECONDS = 0.1


class Transport(kombu_sqlalchemy.Transport):
    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.polling_interval = poll_seconds()


def poll_seconds() -> float:
    from django.conf import settings

    if settings.configured and hasattr(settings, "CTXAPP"):
        return float(settings.CTXAPP.get("CTXAPP_BROKER_POLL_SECONDS", DEFAULT_POLL_SECONDS))
    return DEFAULT_POLL_SECONDS


TRANSPORT_ALIASES.setdefault(ALIAS, "ctxapp.broker:Transport")
