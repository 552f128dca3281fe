"""Retries are harmless: an Idempotency-Key makes every write of the agent API run once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from memory.models import Event, IdempotencyRecord, Message, Session, Task

pytestmark = pytest.mark.django_db


def post(api, path, body, key):  # type: ignore[no-untyped-def]
    return api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def session_id(api_a):  # type: ignore[no-untyped-def]
    return api_a.post("/api/v1/sessions", {"agent": "bot-1"}, format="json").json()["id"]


def test_a_retried_append_returns_the_original_response_and_writes_nothing(api_a, tenant_a, session_id):
    path = f"/api/v1/sessions/{session_id}/messages"
    first = post(api_a, path, {"role": "user", "content": "hi"}, "key-1")
    again = post(api_a, path, {"role": "user", "content": "hi"}, "key-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert Message.objects.count() == 1
    assert Event.objects.filter(tenant=tenant_a, type="message.added").count() == 1
    assert Session.objects.get(public_id=session_id).message_seq == 1


def test_the_same_key_with_another_body_is_409(api_a, session_id):
    path = f"/api/v1/sessions/{session_id}/messages"
    post(api_a, path, {"role": "user", "content": "hi"}, "key-1")
    other = post(api_a, path, {"role": "user", "content": "something else"}, "key-1")
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"
    elsewhere = post(api_a, "/api/v1/sessions", {"agent": "bot-1"}, "key-1")
    assert elsewhere.status_code == 409
    assert Message.objects.count() == 1 and Session.objects.count() == 1


@pytest.mark.parametrize("write", ["session", "batch", "end", "task", "task_patch", "event", "delete"])
def test_every_write_of_the_agent_api_is_idempotent(api_a, tenant_a, session_id, write):
    task_id = api_a.post("/api/v1/tasks", {"session": session_id}, format="json").json()["id"]
    calls = {
        "session": lambda k: post(api_a, "/api/v1/sessions", {"agent": "bot-2"}, k),
        "batch": lambda k: post(
            api_a,
            f"/api/v1/sessions/{session_id}/messages",
            {"messages": [{"role": "user", "content": "a"}] * 3},
            k,
        ),
        "end": lambda k: api_a.post(f"/api/v1/sessions/{session_id}/end", HTTP_IDEMPOTENCY_KEY=k),
        "task": lambda k: post(api_a, "/api/v1/tasks", {"session": session_id, "input": "x"}, k),
        "task_patch": lambda k: api_a.patch(
            f"/api/v1/tasks/{task_id}", {"status": "succeeded"}, format="json", HTTP_IDEMPOTENCY_KEY=k
        ),
        "event": lambda k: post(api_a, "/api/v1/agents/bot-1/events", {"type": "agent.x"}, k),
        "delete": lambda k: api_a.delete(f"/api/v1/sessions/{session_id}", HTTP_IDEMPOTENCY_KEY=k),
    }
    first = calls[write]("retry-me")
    events = Event.objects.filter(tenant=tenant_a).count()
    counts = (Session.objects.count(), Message.objects.count(), Task.objects.count())
    second = calls[write]("retry-me")
    assert first.status_code == second.status_code and first.status_code < 300
    assert (first.json() if first.content else None) == (second.json() if second.content else None)
    assert second["Idempotent-Replayed"] == "true"
    assert Event.objects.filter(tenant=tenant_a).count() == events
    assert (Session.objects.count(), Message.objects.count(), Task.objects.count()) == counts


def test_a_refused_write_stores_no_response_so_a_fixed_retry_can_run(api_a, session_id):
    path = f"/api/v1/sessions/{session_id}/messages"
    bad = post(api_a, path, {"role": "wizard"}, "key-9")
    assert bad.status_code == 422
    assert not IdempotencyRecord.objects.filter(key="key-9").exists()
    good = post(api_a, path, {"role": "user", "content": "ok"}, "key-9")
    assert good.status_code == 201 and Message.objects.count() == 1


def test_keys_are_per_tenant(api_a, api_b, session_id):
    post(api_a, "/api/v1/sessions", {"agent": "x"}, "same-key")
    bobs = post(api_b, "/api/v1/sessions", {"agent": "x"}, "same-key")
    assert bobs.status_code == 201 and "Idempotent-Replayed" not in bobs
    assert Session.objects.filter(agent__external_id="x").count() == 2


def test_an_expired_key_can_be_reused(api_a, session_id):
    path = f"/api/v1/sessions/{session_id}/messages"
    post(api_a, path, {"role": "user", "content": "one"}, "old-key")
    IdempotencyRecord.objects.filter(key="old-key").update(created_at=timezone.now() - timedelta(hours=25))
    again = post(api_a, path, {"role": "user", "content": "two"}, "old-key")
    assert again.status_code == 201 and again.json()["seq"] == 2
    assert "Idempotent-Replayed" not in again
    assert IdempotencyRecord.objects.filter(key="old-key").count() == 1


def test_an_overlong_key_is_refused(api_a, session_id):
    response = post(api_a, f"/api/v1/sessions/{session_id}/messages", {"role": "user"}, "k" * 256)
    assert response.status_code == 422
    assert Message.objects.count() == 0
