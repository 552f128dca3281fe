"""The memory index: full text at once, embeddings in coalesced batches, recovery by the sweep."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from django.db import connection
from django.utils import timezone

from memory.models import MemoryIndexState, MemoryPolicy, Message, MessageEmbeddingStatus
from memory.services import broadcast, message_indexing
from memory.services.embedding import embedder_get
from memory.services.ranking import index_text
from memory.services.sessions import MessageInput, messages_append, session_create

pytestmark = pytest.mark.django_db


def statuses(session) -> list[str]:  # type: ignore[no-untyped-def]
    return list(
        Message.objects.filter(session=session).order_by("seq").values_list("embedding_status", flat=True)
    )


def test_a_message_is_found_by_its_words_and_speaker_at_once(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[MessageInput(role="user", content="My dogs love the beach in Maine", name="Caroline")],
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq FROM memory_message WHERE session_id = %s "
            "AND search_vector @@ to_tsquery('english', 'dog & caroline')",
            [session.pk],
        )
        assert cursor.fetchall() == [(1,)]
    message = Message.objects.get(session=session)
    assert message.embedding_status == MessageEmbeddingStatus.PENDING
    assert message.search_config == "english"


def test_occurred_at_is_kept_and_defaults_to_now(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    said = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    before = timezone.now()
    old, new = messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="user", content="hi", occurred_at=said),
            MessageInput(role="user", content="x"),
        ],
    )
    old.refresh_from_db()
    new.refresh_from_db()
    assert old.occurred_at == said
    assert new.occurred_at >= before


def test_a_transaction_queues_one_drain_however_many_appends_it_holds(
    tenant_a, django_capture_on_commit_callbacks
):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        for index in range(5):
            messages_append(
                tenant=tenant_a, session=session, items=[MessageInput(role="user", content=f"m{index}")]
            )
    jobs = [c for c in callbacks if not broadcast.is_live_update(c)]  # live updates aside
    assert jobs == [message_indexing.memory_index_dispatch]


def test_dispatches_coalesce_until_the_queued_drain_starts(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    dispatched = []
    for index in range(5):  # five commits, each asking for a drain
        messages_append(
            tenant=tenant_a, session=session, items=[MessageInput(role="user", content=f"m{index}")]
        )
        dispatched.append(message_indexing.memory_index_dispatch())
    assert dispatched == [True, False, False, False, False]
    assert MemoryIndexState.objects.get(pk=1).drain_scheduled
    result = message_indexing.memory_index_drain()
    assert result.batches == [5]
    assert not MemoryIndexState.objects.get(pk=1).drain_scheduled
    assert message_indexing.memory_index_dispatch() is True  # the next commit queues the next drain


def test_a_dispatch_while_a_drain_is_queued_writes_nothing(tenant_a):
    from django.test.utils import CaptureQueriesContext

    session = session_create(tenant=tenant_a, agent_external_id="bot")
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="first")])
    assert message_indexing.memory_index_dispatch() is True
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="second")])
    with CaptureQueriesContext(connection) as queries:
        assert message_indexing.memory_index_dispatch() is False
    # One plain read of the flag: no upsert, no row lock on the one global row, no commit.
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["SELECT"]
    assert message_indexing.memory_index_drain().completed == 2  # the queued drain embeds both


def test_n_appends_are_embedded_in_at_most_ceil_n_over_64_batches(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    n = 150
    for start in range(0, n, 10):
        messages_append(
            tenant=tenant_a,
            session=session,
            items=[
                MessageInput(role="user", content=f"note number {i} about topic {i % 7}")
                for i in range(start, start + 10)
            ],
        )
    result = message_indexing.memory_index_drain()
    assert len(result.batches) <= math.ceil(n / 64)
    assert result.completed == n
    assert set(statuses(session)) == {MessageEmbeddingStatus.COMPLETED}
    row = Message.objects.get(session=session, seq=3)
    assert row.embedding_attempts == 1 and row.embedding_model == embedder_get().model_name
    # The vector is the model's vector of the indexed text (date + speaker + content).
    expected = embedder_get().embed(
        [index_text(content=row.content, speaker=None, occurred_at=row.occurred_at)]
    )[0]
    assert float(np.dot(np.asarray(row.embedding), expected)) > 0.999


def test_a_tenant_can_turn_message_embedding_off(tenant_a, tenant_b):
    MemoryPolicy.objects.create(tenant=tenant_a, embed_messages=False, text_search_config="simple")
    session_a = session_create(tenant=tenant_a, agent_external_id="bot")
    session_b = session_create(tenant=tenant_b, agent_external_id="bot")
    messages_append(tenant=tenant_a, session=session_a, items=[MessageInput(role="user", content="the dogs")])
    messages_append(tenant=tenant_b, session=session_b, items=[MessageInput(role="user", content="the dogs")])
    message_indexing.memory_index_drain()
    assert statuses(session_a) == [MessageEmbeddingStatus.SKIPPED]
    assert statuses(session_b) == [MessageEmbeddingStatus.COMPLETED]
    a = Message.objects.get(session=session_a)
    assert a.embedding is None and a.search_config == "simple"
    with connection.cursor() as cursor:  # `simple`: no stemming, stop words kept
        cursor.execute("SELECT search_vector::text FROM memory_message WHERE id = %s", [a.pk])
        assert cursor.fetchone()[0] == "'dogs':2A 'the':1A"


def test_the_sweep_recovers_rows_whose_dispatch_was_lost(tenant_a, django_capture_on_commit_callbacks):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    with django_capture_on_commit_callbacks(execute=False):  # the dispatch never happens
        messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="lost")])
    MemoryIndexState.objects.update_or_create(pk=1, defaults={"drain_scheduled": True})  # a lost job
    assert message_indexing.memory_index_sweep(older_than=timedelta(hours=1)) == 0  # not stale yet
    Message.objects.filter(session=session).update(created_at=timezone.now() - timedelta(minutes=10))
    assert message_indexing.memory_index_sweep() == 1
    assert MemoryIndexState.objects.get(pk=1).drain_scheduled  # re-dispatched despite the stale flag
    message_indexing.memory_index_drain()
    assert statuses(session) == [MessageEmbeddingStatus.COMPLETED]


def test_a_failed_dispatch_is_logged_not_raised_and_leaves_the_sweep_a_way_back(
    tenant_a, broker_down, caplog
):
    from memory.services import jobs

    jobs._last_broker_warning[0] = 0.0  # the warning is logged at most once a minute per process
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    started = time.monotonic()
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="x")])
    assert message_indexing.memory_index_dispatch() is False
    assert time.monotonic() - started < 5  # a refused broker is not retried inside the request
    assert "broker unavailable" in caplog.text
    assert not MemoryIndexState.objects.get(pk=1).drain_scheduled  # the next commit or the sweep retries
    assert statuses(session) == [MessageEmbeddingStatus.PENDING]


def test_an_unknown_text_search_configuration_is_refused_by_the_policy(tenant_a):
    from django.core.exceptions import ValidationError

    policy = MemoryPolicy(tenant=tenant_a, text_search_config="klingon")
    with pytest.raises(ValidationError) as refused:
        policy.full_clean()
    assert "klingon" in str(refused.value)
    MemoryPolicy(tenant=tenant_a, text_search_config="german").full_clean()


def test_reembed_messages_rewrites_every_vector_with_the_configured_model(tenant_a):
    from io import StringIO

    from django.core.management import call_command

    session = session_create(tenant=tenant_a, agent_external_id="bot")
    messages_append(
        tenant=tenant_a, session=session, items=[MessageInput(role="user", content=f"t{i}") for i in range(3)]
    )
    message_indexing.memory_index_drain()
    Message.objects.filter(session=session).update(embedding_model="old-model", embedding_status="failed")
    out = StringIO()
    call_command("reembed", "--messages", "--tenant", tenant_a.slug, stdout=out)
    assert "re-embedded 3 messages in 1 batches" in out.getvalue()
    rows = Message.objects.filter(session=session)
    assert {r.embedding_model for r in rows} == {embedder_get().model_name}
    assert {r.embedding_status for r in rows} == {MessageEmbeddingStatus.COMPLETED}


def test_a_drain_that_finds_a_backlog_queues_a_helper_so_free_workers_join(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    items = [MessageInput(role="user", content=f"backlog note {i}") for i in range(20)]
    messages_append(tenant=tenant_a, session=session, items=items)
    result = message_indexing.memory_index_drain(batch_size=8)
    assert result.batches == [8, 8, 4]
    # Cleared at its start, set again after its first full batch: a second drain was queued.
    assert MemoryIndexState.objects.get(pk=1).drain_scheduled is True
    assert message_indexing.memory_index_drain(batch_size=8).completed == 0  # the helper: nothing left
    messages_append(tenant=tenant_a, session=session, items=items[:3])
    assert message_indexing.memory_index_drain(batch_size=8).batches == [3]
    assert MemoryIndexState.objects.get(pk=1).drain_scheduled is False  # no backlog, no helper
