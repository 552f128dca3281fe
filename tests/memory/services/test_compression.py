"""Compression by priority: categories, priorities, the ratio, decisions kept whole."""

from __future__ import annotations

from typing import Any

import pytest

from memory.exceptions import InvalidInput
from memory.models import Event, Message
from memory.services import history_compression, tokens
from memory.services.sessions import MessageInput, messages_append, session_create

pytestmark = pytest.mark.django_db

CHATTER = "Sure, let me think about how the weather and the weekend plans fit together with lunch. " * 6
DECISION = "Decision: we store invoices in PostgreSQL with one table per tenant, partitioned by month. " * 3
TRACE = "Traceback (most recent call last):\n  File \"app.py\", line 3\nKeyError: 'invoice'\n"
CODE = "```python\ndef total(items):\n    return sum(i.price for i in items)\n```"


@pytest.fixture
def session(tenant_a):
    return session_create(tenant=tenant_a, agent_external_id="coder")


def history(tenant: Any, session: Any) -> list[Message]:
    items = [
        MessageInput(role="user", content=CHATTER),  # 1 conversation
        MessageInput(role="assistant", content=DECISION, event_kind="decision"),  # 2 decision
        MessageInput(role="user", content=CHATTER + " important", metadata={"important": True}),  # 3 +30
        MessageInput(role="tool", content=TRACE),  # 4 error (detected)
        MessageInput(role="assistant", content=CODE),  # 5 code (detected)
        MessageInput(role="tool", content=CHATTER + " ok", metadata={"outcome": "success"}),  # 6 +10
    ]
    items += [MessageInput(role="user", content=CHATTER + f" {i}") for i in range(12)]  # 7..18
    return messages_append(tenant=tenant, session=session, items=items)


def test_messages_get_their_category_and_priority(tenant_a, session):
    messages = history(tenant_a, session)
    from memory.models import DecayPolicy

    scored = history_compression.messages_score(
        policy=DecayPolicy.for_tenant(tenant_a), messages=messages, recent=10
    )
    by_seq = {item.seq: item for item in scored}
    assert (by_seq[1].category, by_seq[1].priority) == ("conversation", 50)
    assert (by_seq[2].category, by_seq[2].priority) == ("decision", 100)
    assert (by_seq[3].category, by_seq[3].priority) == ("conversation", 80)
    assert (by_seq[4].category, by_seq[4].priority) == ("error", 90)
    assert (by_seq[5].category, by_seq[5].priority) == ("code", 70)
    assert (by_seq[6].category, by_seq[6].priority) == ("conversation", 60)
    assert by_seq[8].priority == 50 and by_seq[9].priority == 70  # the newest 10 get +20


def test_compression_respects_the_ratio_and_keeps_decisions_whole(tenant_a, session):
    messages = history(tenant_a, session)
    before = sum(m.token_count for m in messages)
    result = history_compression.session_compress(tenant=tenant_a, session=session, target_ratio=0.3)
    assert result.tokens_before == before
    assert result.tokens_after <= int(before * 0.3)
    assert result.target_met and result.ratio == pytest.approx(result.tokens_after / before)
    assert result.ratio > 0.2  # it fills the budget rather than throwing everything away
    # the figure is exact: recounting what is returned gives the same number
    assert sum(tokens.count_tokens(item.content) for item in result.kept) == result.tokens_after
    kept = {item.seq: item for item in result.kept}
    assert kept[2].content == DECISION and not kept[2].truncated
    assert 4 in kept  # the error outranks the newest conversation
    dropped = [item.seq for item in result.dropped]
    assert 1 in dropped and 5 in dropped
    assert sorted([*kept, *dropped]) == [m.seq for m in messages]
    assert sum(1 for item in result.kept if item.truncated) <= 1
    # read-only on the history
    assert [m.content for m in Message.objects.filter(session=session).order_by("seq")] == [
        m.content for m in messages
    ]
    event = Event.objects.get(tenant=tenant_a, type="session.compressed")
    assert event.payload["tokens_after"] == result.tokens_after and event.payload["dropped"] == len(dropped)


def test_decisions_stay_whole_even_beyond_the_budget(tenant_a, session):
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="assistant", content=DECISION, event_kind="decision"),
            MessageInput(role="user", content="ok"),
        ],
    )
    result = history_compression.session_compress(tenant=tenant_a, session=session, target_ratio=0.1)
    assert [item.seq for item in result.kept] == [1]
    assert result.kept[0].content == DECISION
    assert not result.target_met and result.ratio > 0.1


def test_an_empty_history_compresses_to_nothing(tenant_a, session):
    result = history_compression.session_compress(tenant=tenant_a, session=session)
    assert (result.tokens_before, result.tokens_after, result.ratio, result.target_met) == (0, 0, 1.0, True)
    assert result.target_ratio == 0.3


@pytest.mark.parametrize("ratio", [0, -0.5, 1.5])
def test_a_ratio_outside_0_1_is_refused(tenant_a, session, ratio):
    with pytest.raises(InvalidInput):
        history_compression.session_compress(tenant=tenant_a, session=session, target_ratio=ratio)
    assert not Event.objects.filter(type="session.compressed").exists()
