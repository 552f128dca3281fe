from __future__ import annotations

import threading

import pytest
from django.db import connection

from memory.exceptions import SessionEnded
from memory.models import Event, Message, SessionStatus
from memory.services.sessions import MessageInput, messages_append, session_create


@pytest.mark.django_db
def test_append_assigns_consecutive_seqs_and_records_events(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot-1", model_name="gpt-4o")
    first = messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="hi")])
    batch = messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="assistant", content="hello there"),
            MessageInput(role="user", content="ok"),
        ],
    )
    assert [m.seq for m in first + batch] == [1, 2, 3]
    assert first[0].token_count == 1
    events = list(Event.objects.filter(tenant=tenant_a).order_by("seq"))
    assert [e.type for e in events] == ["session.created"] + ["message.added"] * 3
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events[1].payload["gen_ai.conversation.id"] == session.public_id
    assert events[1].payload["gen_ai.agent.id"] == "bot-1"
    assert events[1].payload["gen_ai.request.model"] == "gpt-4o"


@pytest.mark.django_db
def test_append_to_ended_session_is_refused_and_writes_nothing(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot-1")
    session.status = SessionStatus.ENDED
    session.save(update_fields=["status"])
    with pytest.raises(SessionEnded):
        messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="hi")])
    assert Message.objects.count() == 0
    assert Event.objects.filter(type="message.added").count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_are_gapless(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot-1")
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(10):
                messages_append(
                    tenant=tenant_a, session=session, items=[MessageInput(role="user", content="x")]
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    seqs = sorted(Message.objects.filter(session=session).values_list("seq", flat=True))
    assert seqs == list(range(1, 81))
