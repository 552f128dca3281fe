"""Prepared statements for the hot paths: planned once per connection, not on every call.

Django's PostgreSQL backend sends every query with its parameters merged into the text
(client-side binding) and never prepares one. For the statements an agent runs every turn (the
append CTE, the checkpoint write, the one-row lookups) PostgreSQL then plans the same text again
on every call: 1.1 ms of planning for the 1.6 ms append statement on the embedded server (EXPLAIN
ANALYZE). `prepared_cursor()` gives a Django cursor (so query
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
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.postgresql import base as postgresql
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

# Django's other cursors never ask for preparation; with this threshold psycopg never prepares a
# statement of theirs on its own either (it would after this many runs of one text).
ONLY_WHEN_ASKED = 2**62


# Django's cursor class over psycopg's server-binding `Cursor` (django-stubs do not type it).
ServerBindingCursor: Any = postgresql.ServerBindingCursor


class PreparingCursor(ServerBindingCursor):
    """Django's server-binding psycopg cursor, asking psycopg to prepare every statement it runs."""

    def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any) -> Any:
        return super().execute(query, params, prepare=True, **kwargs)


class LoggedPreparedCursor(CursorDebugWrapper):
    """Django's debug cursor, logging the statement with its parameters composed client-side.

    Django's log asks psycopg for the text it sent, which psycopg keeps only for statements it did
    not prepare; composing it from the statement and its parameters gives the same text.
    """

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(self.db.ops.compose_sql(sql, params), use_last_executed_query=False):
            return CursorWrapper.execute(self, sql, params)


@contextmanager
def prepared_cursor(using: str = DEFAULT_DB_ALIAS) -> Iterator[Any]:
    """A cursor of the `using` connection whose statements are prepared (see the module doc)."""
    connection = connections[using]
    if not settings.CTXAPP.db_prepared_statements:
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    conn = connection.connection
    if conn.prepare_threshold is None:  # Django's default: psycopg then prepares nothing at all
        conn.prepare_threshold = ONLY_WHEN_ASKED
    with connection.wrap_database_errors:
        raw = PreparingCursor(conn)
    # What Django's cursor factory does with a cursor it makes (thread check, query log, execute
    # wrappers), through its public methods.
    connection.validate_thread_sharing()
    logged = connection.queries_logged
    cursor = LoggedPreparedCursor(raw, connection) if logged else connection.make_cursor(raw)
    with cursor:
        yield cursor
