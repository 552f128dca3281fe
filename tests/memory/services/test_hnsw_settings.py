"""Filtered vector searches keep pgvector's iterative scans on, whatever transaction set them.

A session-level SET made inside a transaction that later rolls back is undone; a connection
remembered as configured would then scan HNSW with pgvector's defaults, and a tenant whose rows
are not among the whole table's nearest would get fewer results than it has."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from memory.services.experience_search import configure_hnsw

pytestmark = pytest.mark.django_db


def iterative_scan() -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('hnsw.iterative_scan', true)")
        return cursor.fetchone()[0]


class Undone(Exception):
    pass


def test_a_rolled_back_transaction_does_not_leave_later_searches_without_iterative_scans():
    with pytest.raises(Undone), transaction.atomic():
        configure_hnsw()
        assert iterative_scan() == "relaxed_order"
        raise Undone  # the transaction that configured it rolls back: so does its SET
    assert iterative_scan() in (None, "", "off")
    configure_hnsw()  # the next search on the same connection
    assert iterative_scan() == "relaxed_order"
