"""Session, message and task services without HTTP: validation, end, delete, task races."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from memory.exceptions import NoSession, NotFound, SessionEnded, TaskFinished
from memory.models import Event, Message, Session, SessionStatus, Task, TaskStatus
from memory.services import sessions as svc
from memory.services.sessions import MessageInput


@pytest.mark.django_db
def test_an_append_inside_a_callers_transaction_leaves_it_usable_after_session_ended(tenant_a):
    session = svc.session_create(tenant=tenant_a, agent_external_id="bot")
    svc.session_end(tenant=tenant_a, session=session)
    with transaction.atomic():
        with pytest.raises(SessionEnded):
            svc.messages_append(
                tenant=tenant_a, session=session, items=[MessageInput(role="user", content="x")]
            )
        # The caller's transaction is not poisoned: it can still write.
        svc.task_create(tenant=tenant_a, session=session, input="after the refusal")
    assert Task.objects.count() == 1 and Message.objects.count() == 0


@pytest.mark.django_db
def test_end_and_delete(tenant_a):
    session = svc.session_create(tenant=tenant_a, agent_external_id="bot", model_name="gpt-4o")
    svc.messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="hello")])
    ended = svc.session_end(tenant=tenant_a, session=session)
    assert ended.status == SessionStatus.ENDED and ended.expires_at is None
    assert svc.session_latest(tenant=tenant_a, agent_external_id="bot").pk == session.pk
    task = svc.task_create(tenant=tenant_a, session=session, input="x")
    svc.session_delete(tenant=tenant_a, session=session)
    assert not Session.objects.exists() and not Message.objects.exists()
    task.refresh_from_db()
    assert task.session is None  # the execution record stays, unlinked
    deleted = Event.objects.get(type="session.deleted")
    assert deleted.session is None and deleted.payload["gen_ai.conversation.id"] == session.public_id
    with pytest.raises(NoSession):
        svc.session_latest(tenant=tenant_a, agent_external_id="bot")
    with pytest.raises(NotFound):
        svc.session_get(tenant=tenant_a, session_id=session.public_id)


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_finishes_distil_the_task_once(tenant_a, monkeypatch):
    from memory.services import distillation

    finished: list[str] = []
    original = distillation.task_finished

    def spy(*, tenant, task):  # type: ignore[no-untyped-def]
        finished.append(task.status)
        original(tenant=tenant, task=task)

    monkeypatch.setattr(distillation, "task_finished", spy)
    task = svc.task_create(tenant=tenant_a, agent_external_id="bot", input="x")
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def finish(status: str) -> None:
        try:
            start.wait()
            svc.task_update(tenant=tenant_a, task=task, status=status, output=status)
            outcomes.append("ok")
        except TaskFinished:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=finish, args=(s,)) for s in (TaskStatus.SUCCEEDED, TaskStatus.FAILED)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["ok", "refused"]
    assert len(finished) == 1
    stored = Task.objects.get(pk=task.pk)
    assert stored.status == finished[0] and stored.output == finished[0]
    assert Event.objects.filter(type="task.completed").count() == 1
