"""What an append costs the database: no redundant index written, the session row updated in place
while a session is busy, every field stored as given (docs/benchmarks.md, bench_peers.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from memory.models import Message, Session, Tenant
from memory.services import sessions as svc

pytestmark = pytest.mark.django_db


def append(tenant: Tenant, session: Session, text: str) -> list[Message]:
    return svc.messages_append(
        tenant=tenant, session_id=session.public_id, items=[svc.MessageInput(role="user", content=text)]
    )


def test_a_busy_session_keeps_its_access_time_for_a_second_then_moves_it(tenant_a: Tenant) -> None:
    session = svc.session_create(tenant=tenant_a, agent_external_id="bot")
    old = timezone.now() - timedelta(minutes=5)
    Session.objects.filter(pk=session.pk).update(last_accessed_at=old, expires_at=old + timedelta(hours=1))
    append(tenant_a, session, "after a pause")
    touched = Session.objects.get(pk=session.pk)
    assert touched.last_accessed_at > old + timedelta(minutes=4)
    assert touched.expires_at == touched.last_accessed_at + timedelta(seconds=touched.idle_ttl_seconds)
    append(tenant_a, session, "straight after")  # within the second: the row's indexed columns stay
    again = Session.objects.get(pk=session.pk)
    assert (again.last_accessed_at, again.expires_at) == (touched.last_accessed_at, touched.expires_at)
    assert again.message_count == 2 and again.message_seq == 2


def index_columns(table: str) -> dict[str, list[str]]:
    """Each plain (non-partial, btree) index of `table` with its key columns, in order."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT i.relname, array_agg(a.attname ORDER BY k.ord)
            FROM pg_index x
            JOIN pg_class i ON i.oid = x.indexrelid
            JOIN pg_class t ON t.oid = x.indrelid
            JOIN pg_am am ON am.oid = i.relam
            CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
            WHERE t.relname = %s AND am.amname = 'btree' AND x.indpred IS NULL
            GROUP BY i.relname
            """,
            [table],
        )
        return {name: list(columns) for name, columns in cursor.fetchall()}


@pytest.mark.parametrize("model", [Message, Session, "memory.Event"])
def test_no_index_of_a_hot_table_is_a_prefix_of_another(model: Any) -> None:
    from django.apps import apps  # lazy: django-setup

    table = (apps.get_model(model) if isinstance(model, str) else model)._meta.db_table
    indexes = index_columns(table)
    redundant = [
        (name, other)
        for name, columns in indexes.items()
        for other, longer in indexes.items()
        if other != name and len(longer) > len(columns) and longer[: len(columns)] == columns
    ]
    assert redundant == [], f"{table}: an index that another one already covers is written on every append"


def test_every_field_of_a_batch_is_stored_as_given_whatever_its_characters(tenant_a: Tenant) -> None:
    # The rows travel as one JSON document (jsonb_to_recordset): quotes, backslashes, characters
    # outside the BMP, nested JSON, nulls and explicit times must come back exactly as sent.
    session = svc.session_create(tenant=tenant_a, agent_external_id="storage")
    said = timezone.now() - timedelta(days=400, microseconds=7)
    odd = 'a "quoted" \\ back\\slash, tab\t, newline\n, 😀 emoji, ü, 中文, {"not": "json"}'
    items = [
        svc.MessageInput(role="user", content=odd, name='Dr. "O\'Brien"', occurred_at=said, turn_id="t-1"),
        svc.MessageInput(
            role="assistant",
            content="",
            tool_calls=[
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": [1, 2.5, null]}'},
                }
            ],
            parent_seq=1,
            artifact_refs=[{"uri": "s3://b/k", "sha": "é"}],
            metadata={"nested": {"list": [True, None, 3]}, "ünï": "😀"},
            event_kind="tool_request",
        ),
        svc.MessageInput(role="tool", content="42", tool_call_id="c1"),
    ]
    written = svc.messages_append(tenant=tenant_a, session=session, items=items)
    stored = list(Message.objects.filter(session=session).order_by("seq"))
    assert [m.seq for m in stored] == [1, 2, 3] == [m.seq for m in written]
    for given, row in zip(items, stored, strict=True):
        for name in ("role", "content", "name", "turn_id", "tool_call_id", "tool_calls", "event_kind",
                     "parent_seq", "artifact_refs", "metadata"):  # fmt: skip
            assert getattr(row, name) == getattr(given, name), name
    assert stored[0].occurred_at == said
    assert stored[2].occurred_at == stored[2].created_at  # default: when it was appended
