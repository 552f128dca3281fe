"""Filtered vector searches keep pgvector's iterative scans on, whatever transaction ran before.

Filters (tenant, scope, visibility) apply after the HNSW scan: without iterative scans a tenant
whose rows are not among the whole table's nearest gets fewer results than it has. Each connection
is configured once when it is made, in autocommit, so neither a rolled-back transaction nor a
search inside one has to set them again."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from memory.services.experience_search import HNSW_EF_SEARCH, configure_hnsw

pytestmark = pytest.mark.django_db(transaction=True)


def settings_now() -> tuple[str | None, str | None]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('hnsw.iterative_scan', true), current_setting('hnsw.ef_search', true)"
        )
        return cursor.fetchone()


class Undone(Exception):
    pass


def test_a_new_connection_has_iterative_scans_before_any_search():
    connection.close()
    connection.ensure_connection()
    assert settings_now() == ("relaxed_order", str(HNSW_EF_SEARCH))


def test_a_search_inside_a_transaction_sets_nothing_and_a_rollback_undoes_nothing():
    connection.ensure_connection()
    with pytest.raises(Undone), transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            configure_hnsw()
        assert [q["sql"] for q in queries.captured_queries] == []
        assert settings_now()[0] == "relaxed_order"
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL hnsw.iterative_scan = off")
        raise Undone  # the transaction rolls back: the connection's own setting is back
    assert settings_now() == ("relaxed_order", str(HNSW_EF_SEARCH))
