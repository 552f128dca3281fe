"""Prepared statements for the hot paths: planned once per connection, not on every call.

Django's PostgreSQL backend sends every query with its parameters merged into the text
(client-side binding) and never prepares one. For the statements an agent runs every turn (the
append CTE, the checkpoint write, the one-row lookups) PostgreSQL then plans the same text again
on every call: 1.1 ms of planning for the 1.6 ms append statement on the embedded server (EXPLAIN
ANALYZE, docs/benchmarks.md, "Fourth pass"). `prepared_cursor()` gives a Django cursor (so query
logging, `execute_wrapper` and the tests' statement counts see it as any other) over a psycopg
cursor that binds parameters on the server and prepares each statement text the first time it
runs on a connection; psycopg keeps the prepared statements per connection (at most 100, least
recently used dropped).

Prepared statements need a session-level connection to PostgreSQL: PgBouncer in transaction mode
before 1.21 (or without `max_prepared_statements`) does not support them.
`CTXAPP_DB_PREPARED_STATEMENTS=off` makes this an ordinary Django cursor.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from django.conf import settings
from django.db import connection
from django.db.backends.postgresql import base as postgresql

# Django's other cursors never ask for preparation; with this threshold psycopg never prepares a
# statement of theirs on its own either (it would after this many runs of one text).
_ONLY_WHEN_ASKED = 2**62


# Django's cursor class over psycopg's server-binding `Cursor` (django-stubs do not type it).
_ServerBindingCursor: Any = postgresql.ServerBindingCursor


class _PreparingCursor(_ServerBindingCursor):
    """psycopg's server-binding cursor, preparing every statement it runs."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any) -> Any:
        return super().execute(query, params, prepare=True, **kwargs)

    def _send_query_prepared(self, name: bytes, pgq: Any, **kwargs: Any) -> None:
        # psycopg records the query it ran only when it did not prepare it; Django's query log
        # (connection.queries, CaptureQueriesContext) reads it from there.
        self._query = pgq
        super()._send_query_prepared(name, pgq, **kwargs)


@contextmanager
def prepared_cursor() -> Iterator[Any]:
    """A cursor of the default connection whose statements are prepared (see the module doc)."""
    if not settings.CTXAPP.db_prepared_statements:
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    conn = connection.connection
    if conn.prepare_threshold is None:  # Django's default: psycopg then prepares nothing at all
        conn.prepare_threshold = _ONLY_WHEN_ASKED
    with connection.wrap_database_errors:
        raw = _PreparingCursor(conn)
    # Django's own cursor factory step (thread check, debug logging, execute wrappers); it has no
    # public way to wrap a cursor it did not create.
    cursor = cast(Any, connection)._prepare_cursor(raw)
    with cursor:
        yield cursor
