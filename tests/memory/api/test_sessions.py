"""The agent API over HTTP: sessions, messages, tasks. Alice's stuff is never Bob's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from memory.models import Event, Message, Session, SessionStatus, Task, TaskStatus
from memory.services import decay, distillation

pytestmark = pytest.mark.django_db


def create_session(api: Any, agent: str = "bot-1", **extra: Any) -> dict[str, Any]:
    response = api.post("/api/v1/sessions", {"agent": agent, **extra}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def append(api: Any, session_id: str, body: Any) -> Any:
    return api.post(f"/api/v1/sessions/{session_id}/messages", body, format="json")


def event_types(tenant: Any) -> list[str]:
    return list(Event.objects.filter(tenant=tenant).order_by("seq").values_list("type", flat=True))


# --- sessions ------------------------------------------------------------------------------------


def test_it_creates_a_session_with_an_unguessable_id_and_records_it(api_a, tenant_a):
    body = create_session(api_a, "support-bot", user_id="u-1", model="gpt-4o", metadata={"channel": "web"})
    assert body["id"].startswith("sess_") and len(body["id"]) == 29
    assert body["agent"] == "support-bot"
    assert body["status"] == "open"
    assert body["idle_ttl_seconds"] == 24 * 3600
    session = Session.objects.get(public_id=body["id"])
    assert (
        session.tenant == tenant_a
        and session.model_name == "gpt-4o"
        and session.metadata == {"channel": "web"}
    )
    event = Event.objects.get(tenant=tenant_a, type="session.created")
    assert event.payload["gen_ai.conversation.id"] == body["id"]
    assert event.payload["gen_ai.agent.id"] == "support-bot"
    assert event.payload["gen_ai.request.model"] == "gpt-4o"


def test_it_validates_session_creation(api_a, tenant_a):
    response = api_a.post("/api/v1/sessions", {"user_id": "u"}, format="json")
    assert response.status_code == 422
    assert "agent" in response.json()["error"]["details"]["fields"]
    for bad_agent in ["a/b", "  ", "tab\there"]:
        response = api_a.post("/api/v1/sessions", {"agent": bad_agent}, format="json")
        assert response.status_code == 422, bad_agent
        assert "agent" in response.json()["error"]["details"]["fields"]
    response = api_a.post("/api/v1/sessions", {"agent": "a", "ttl_seconds": 5}, format="json")
    assert response.status_code == 422
    assert "ttl_seconds" in response.json()["error"]["details"]["fields"]
    assert Session.objects.count() == 0


def test_it_lists_sessions_by_agent_user_and_status_with_cursor_pages(api_a, api_b):
    ids = [create_session(api_a, "bot-1", user_id="u1")["id"] for _ in range(3)]
    other = create_session(api_a, "bot-2", user_id="u2")["id"]
    create_session(api_b, "bot-1", user_id="u1")  # Bob's: never listed for Alice
    api_a.post(f"/api/v1/sessions/{ids[0]}/end")

    first = api_a.get("/api/v1/sessions", {"agent": "bot-1", "limit": 2}).json()
    assert [s["id"] for s in first["items"]] == [ids[2], ids[1]]
    second = api_a.get(
        "/api/v1/sessions", {"agent": "bot-1", "limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert [s["id"] for s in second["items"]] == [ids[0]]
    assert second["next_cursor"] is None

    assert [s["id"] for s in api_a.get("/api/v1/sessions", {"user_id": "u2"}).json()["items"]] == [other]
    assert [s["id"] for s in api_a.get("/api/v1/sessions", {"status": "ended"}).json()["items"]] == [ids[0]]
    assert len(api_a.get("/api/v1/sessions").json()["items"]) == 4
    bad = api_a.get("/api/v1/sessions", {"cursor": "%%%"})
    assert bad.status_code == 422 and "cursor" in bad.json()["error"]["details"]["fields"]


def test_reading_a_session_keeps_it_alive(api_a, django_capture_on_commit_callbacks):
    body = create_session(api_a)
    Session.objects.filter(public_id=body["id"]).update(
        last_accessed_at="2020-01-01T00:00:00Z", expires_at="2020-01-02T00:00:00Z"
    )
    with django_capture_on_commit_callbacks(execute=True):
        read = api_a.get(f"/api/v1/sessions/{body['id']}").json()
    assert read["last_accessed_at"] > "2026"
    session = Session.objects.get(public_id=body["id"])
    assert session.last_accessed_at.year > 2020 and session.expires_at.year > 2020


def test_ending_a_session_calls_decay_inside_the_transaction_and_records_it(api_a, tenant_a, monkeypatch):
    from django.db import connection

    calls: list[tuple[str, bool]] = []
    original = decay.facts_on_session_end

    def spy(*, tenant: Any, session: Any) -> None:
        calls.append((session.public_id, connection.in_atomic_block))
        original(tenant=tenant, session=session)

    monkeypatch.setattr(decay, "facts_on_session_end", spy)
    body = create_session(api_a)
    append(api_a, body["id"], {"role": "user", "content": "hello"})
    ended = api_a.post(f"/api/v1/sessions/{body['id']}/end")
    assert ended.status_code == 200
    assert ended.json()["status"] == "ended" and ended.json()["ended_at"]
    assert calls == [(body["id"], True)]
    assert event_types(tenant_a)[-1] == "session.ended"
    again = api_a.post(f"/api/v1/sessions/{body['id']}/end")
    assert again.status_code == 200 and again.json()["status"] == "ended"
    assert event_types(tenant_a).count("session.ended") == 1
    refused = append(api_a, body["id"], {"role": "user", "content": "late"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_ended"
    assert Message.objects.count() == 1


def test_deleting_a_session_removes_messages_but_keeps_its_events(api_a, tenant_a):
    body = create_session(api_a)
    append(
        api_a,
        body["id"],
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
    )
    response = api_a.delete(f"/api/v1/sessions/{body['id']}")
    assert response.status_code == 204
    assert not Session.objects.filter(public_id=body["id"]).exists()
    assert Message.objects.count() == 0
    events = list(Event.objects.filter(tenant=tenant_a).order_by("seq"))
    assert [e.type for e in events] == [
        "session.created",
        "message.added",
        "message.added",
        "session.deleted",
    ]
    assert all(e.payload["gen_ai.conversation.id"] == body["id"] for e in events)
    assert api_a.get(f"/api/v1/sessions/{body['id']}").status_code == 404


def test_latest_session_of_an_agent(api_a):
    missing = api_a.get("/api/v1/agents/nobody/latest-session")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    api_a.post("/api/v1/agents/quiet-bot/events", {"type": "agent.hello"}, format="json")
    none_yet = api_a.get("/api/v1/agents/quiet-bot/latest-session")
    assert none_yet.status_code == 404 and none_yet.json()["error"]["code"] == "no_session"
    create_session(api_a, "bot-1")
    newest = create_session(api_a, "bot-1")
    assert api_a.get("/api/v1/agents/bot-1/latest-session").json()["id"] == newest["id"]


# --- messages ------------------------------------------------------------------------------------


def test_it_appends_one_message_and_a_batch_with_consecutive_seqs(api_a, tenant_a):
    session_id = create_session(api_a, model="gpt-4o")["id"]
    one = append(api_a, session_id, {"role": "user", "content": "Hello there", "turn_id": "t1"})
    assert one.status_code == 201
    assert one.json()["seq"] == 1 and one.json()["token_count"] == 2 and one.json()["turn_id"] == "t1"
    batch = append(
        api_a,
        session_id,
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                    ],
                },
                {
                    "role": "tool",
                    "content": "42",
                    "tool_call_id": "c1",
                    "parent_seq": 2,
                    "artifact_refs": ["s3://x"],
                },
            ]
        },
    )
    assert batch.status_code == 201
    assert batch.json()["first_seq"] == 2 and batch.json()["last_seq"] == 3
    stored = list(Message.objects.filter(session__public_id=session_id).order_by("seq"))
    assert [(m.seq, m.role) for m in stored] == [(1, "user"), (2, "assistant"), (3, "tool")]
    assert stored[1].tool_calls[0]["function"]["name"] == "lookup"
    assert stored[2].tool_call_id == "c1" and stored[2].artifact_refs == ["s3://x"]
    session = Session.objects.get(public_id=session_id)
    assert session.message_seq == 3 and session.message_count == 3
    added = Event.objects.filter(tenant=tenant_a, type="message.added").order_by("seq")
    assert [e.payload["seq"] for e in added] == [1, 2, 3]


def test_messages_list_after_a_seq(api_a):
    session_id = create_session(api_a)["id"]
    append(api_a, session_id, {"messages": [{"role": "user", "content": str(i)} for i in range(5)]})
    page = api_a.get(f"/api/v1/sessions/{session_id}/messages", {"after": 1, "limit": 2}).json()
    assert [m["seq"] for m in page["items"]] == [2, 3] and page["next_after"] == 3
    page = api_a.get(f"/api/v1/sessions/{session_id}/messages", {"after": 3, "limit": 2}).json()
    assert [m["content"] for m in page["items"]] == ["3", "4"] and page["next_after"] is None
    assert api_a.get(f"/api/v1/sessions/{session_id}/messages", {"after": -1}).status_code == 422


@pytest.mark.parametrize(
    ("message", "field"),
    [
        ({"role": "robot", "content": "x"}, "role"),
        ({"content": "x"}, "role"),
        ({"role": "assistant", "tool_calls": {"id": "c1"}}, "tool_calls"),
        ({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}, "tool_calls"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "code", "function": {"name": "f", "arguments": ""}}],
            },
            "tool_calls",
        ),
        (
            {
                "role": "user",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}],
            },
            "tool_calls",
        ),
        ({"role": "tool", "content": "42"}, "tool_call_id"),
        ({"role": "user", "content": 42}, "content"),
        ({"role": "user", "content": "x", "parent_seq": 0}, "parent_seq"),
        ({"role": "user", "content": "x", "metadata": []}, "metadata"),
        ({"role": "user", "content": "x", "colour": "red"}, "colour"),
    ],
)
def test_a_bad_message_is_refused_naming_the_field(api_a, tenant_a, message, field):
    session_id = create_session(api_a)["id"]
    response = append(api_a, session_id, message)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"
    assert field in response.json()["error"]["details"]["fields"]
    assert Message.objects.count() == 0
    assert "message.added" not in event_types(tenant_a)


def test_a_batch_with_one_bad_message_writes_none_of_them(api_a, tenant_a):
    session_id = create_session(api_a)["id"]
    messages = [{"role": "user", "content": "fine"}] * 3 + [{"role": "wizard", "content": "bad"}]
    response = append(api_a, session_id, {"messages": messages})
    assert response.status_code == 422
    assert list(response.json()["error"]["details"]["fields"]) == ["messages[3].role"]
    assert response.json()["error"]["message"].startswith("messages[3].role")
    assert Message.objects.count() == 0
    assert Session.objects.get(public_id=session_id).message_seq == 0
    assert "message.added" not in event_types(tenant_a)


def test_content_over_the_limit_is_refused(api_a, settings):
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, message_max_bytes=10)
    session_id = create_session(api_a)["id"]
    ok = append(api_a, session_id, {"role": "user", "content": "0123456789"})
    assert ok.status_code == 201
    too_long = append(api_a, session_id, {"messages": [{"role": "user", "content": "ééééééé"}]})  # 14 bytes
    assert too_long.status_code == 422
    assert "messages[0].content" in too_long.json()["error"]["details"]["fields"]
    assert Message.objects.count() == 1


def test_a_batch_over_the_limit_is_refused(api_a, settings):
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, batch_max_messages=3)
    session_id = create_session(api_a)["id"]
    response = append(api_a, session_id, {"messages": [{"role": "user", "content": "x"}] * 4})
    assert response.status_code == 422
    assert "messages" in response.json()["error"]["details"]["fields"]
    empty = append(api_a, session_id, {"messages": []})
    assert empty.status_code == 422
    assert Message.objects.count() == 0


def test_appending_to_an_unknown_session_is_404(api_a):
    response = append(api_a, "sess_000000000000000000000000", {"role": "user", "content": "x"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


# --- tasks ---------------------------------------------------------------------------------------


def test_task_lifecycle_hands_the_finished_task_to_distillation(api_a, tenant_a, monkeypatch):
    from django.db import connection

    finished: list[tuple[str, str, bool]] = []
    original = distillation.task_finished

    def spy(*, tenant: Any, task: Any) -> None:
        finished.append((task.public_id, task.status, connection.in_atomic_block))
        original(tenant=tenant, task=task)

    monkeypatch.setattr(distillation, "task_finished", spy)
    session_id = create_session(api_a, "bot-1", user_id="u-9")["id"]
    created = api_a.post(
        "/api/v1/tasks", {"session": session_id, "title": "fix", "input": "  do it  "}, format="json"
    )
    assert created.status_code == 201
    task = created.json()
    assert task["id"].startswith("task_") and task["status"] == "pending"
    assert task["agent"] == "bot-1" and task["user_id"] == "u-9" and task["input"] == "  do it  "
    assert task["expires_at"] is not None

    running = api_a.patch(f"/api/v1/tasks/{task['id']}", {"status": "running"}, format="json")
    assert running.status_code == 200 and running.json()["status"] == "running"
    back = api_a.patch(f"/api/v1/tasks/{task['id']}", {"status": "pending"}, format="json")
    assert back.status_code == 409 and back.json()["error"]["code"] == "invalid_transition"
    done = api_a.patch(
        f"/api/v1/tasks/{task['id']}", {"status": "succeeded", "output": "fixed"}, format="json"
    )
    assert done.status_code == 200 and done.json()["output"] == "fixed" and done.json()["finished_at"]
    assert finished == [(task["id"], "succeeded", True)]
    final = api_a.patch(f"/api/v1/tasks/{task['id']}", {"output": "changed"}, format="json")
    assert final.status_code == 409 and final.json()["error"]["code"] == "task_finished"
    stored = Task.objects.get(public_id=task["id"])
    assert stored.status == TaskStatus.SUCCEEDED and stored.output == "fixed"
    assert event_types(tenant_a)[-3:] == ["task.created", "task.updated", "task.completed"]
    completed = Event.objects.get(tenant=tenant_a, type="task.completed")
    assert completed.payload["task"] == task["id"] and completed.payload["status"] == "succeeded"
    assert api_a.get(f"/api/v1/tasks/{task['id']}").json()["status"] == "succeeded"


def test_a_task_without_a_session(api_a, tenant_a):
    created = api_a.post("/api/v1/tasks", {"agent": "planner", "input": "plan"}, format="json").json()
    assert created["session"] is None and created["agent"] == "planner"
    bare = api_a.post("/api/v1/tasks", {"input": "anything"}, format="json")
    assert bare.status_code == 201 and bare.json()["agent"] is None
    assert Event.objects.filter(tenant=tenant_a, type="task.created", stream="tenant").count() == 1
    bad = api_a.patch(f"/api/v1/tasks/{created['id']}", {"status": "done"}, format="json")
    assert bad.status_code == 422 and "status" in bad.json()["error"]["details"]["fields"]


def test_tasks_are_listed_by_session_agent_user_and_status(api_a, api_b):
    session_id = create_session(api_a, "bot-1", user_id="u1")["id"]
    first = api_a.post("/api/v1/tasks", {"session": session_id, "input": "a"}, format="json").json()
    second = api_a.post("/api/v1/tasks", {"agent": "bot-2", "user_id": "u2"}, format="json").json()
    api_a.patch(f"/api/v1/tasks/{first['id']}", {"status": "succeeded"}, format="json")
    api_b.post("/api/v1/tasks", {"agent": "bot-1"}, format="json")  # Bob's: never listed for Alice

    def ids(**params: Any) -> list[str]:
        return [t["id"] for t in api_a.get("/api/v1/tasks", params).json()["items"]]

    assert ids() == [second["id"], first["id"]]
    assert ids(session=session_id) == [first["id"]]
    assert ids(agent="bot-2") == [second["id"]]
    assert ids(user_id="u1") == [first["id"]]
    assert ids(status="succeeded") == [first["id"]]
    page = api_a.get("/api/v1/tasks", {"limit": 1}).json()
    assert len(page["items"]) == 1 and page["next_cursor"]
    assert api_a.get("/api/v1/tasks", {"status": "done"}).status_code == 422


# --- malformed JSON, and Bob never touches Alice's stuff ---------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/sessions"),
        ("post", "/api/v1/sessions/{sid}/messages"),
        ("post", "/api/v1/tasks"),
        ("patch", "/api/v1/tasks/{tid}"),
        ("post", "/api/v1/agents/bot-1/events"),
    ],
)
def test_malformed_json_is_400_invalid_json(api_a, tenant_a, method, path):
    session_id = create_session(api_a)["id"]
    task_id = api_a.post("/api/v1/tasks", {"session": session_id}, format="json").json()["id"]
    before = Event.objects.filter(tenant=tenant_a).count()
    url = path.format(sid=session_id, tid=task_id)
    response = getattr(api_a, method)(url, data='{"role": "user", ', content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert Event.objects.filter(tenant=tenant_a).count() == before


def test_bob_cannot_reach_alices_sessions_messages_tasks_or_events(api_a, api_b, tenant_a):
    session_id = create_session(api_a, "alice-bot")["id"]
    append(api_a, session_id, {"role": "user", "content": "secret"})
    task_id = api_a.post("/api/v1/tasks", {"session": session_id}, format="json").json()["id"]
    before = (Event.objects.count(), Message.objects.count())

    def refused(response: Any) -> None:
        assert response.status_code == 404, response.content
        assert response.json()["error"]["code"] == "not_found"

    refused(api_b.get(f"/api/v1/sessions/{session_id}"))
    refused(api_b.delete(f"/api/v1/sessions/{session_id}"))
    refused(api_b.post(f"/api/v1/sessions/{session_id}/end"))
    refused(append(api_b, session_id, {"role": "user", "content": "x"}))
    refused(append(api_b, session_id, {"messages": [{"role": "user", "content": "x"}]}))
    refused(api_b.get(f"/api/v1/sessions/{session_id}/messages"))
    refused(api_b.get("/api/v1/agents/alice-bot/latest-session"))
    refused(api_b.get("/api/v1/agents/alice-bot/events"))
    refused(
        api_b.post(
            "/api/v1/agents/alice-bot/events", {"type": "agent.x", "session": session_id}, format="json"
        )
    )
    refused(api_b.get(f"/api/v1/tasks/{task_id}"))
    refused(api_b.patch(f"/api/v1/tasks/{task_id}", {"status": "failed"}, format="json"))
    refused(api_b.post("/api/v1/tasks", {"session": session_id}, format="json"))
    assert api_b.get("/api/v1/sessions").json()["items"] == []
    assert api_b.get("/api/v1/tasks").json()["items"] == []
    assert api_b.get("/api/v1/tasks", {"session": session_id}).json()["items"] == []
    assert api_b.get("/api/v1/sessions", {"agent": "alice-bot"}).json()["items"] == []

    assert (Event.objects.count(), Message.objects.count()) == before
    # Bob naming the same agent gets his own agent and session; Alice's latest stays hers.
    bobs = api_b.post("/api/v1/sessions", {"agent": "alice-bot"}, format="json").json()
    assert Session.objects.get(public_id=bobs["id"]).agent.tenant != tenant_a
    assert api_a.get("/api/v1/agents/alice-bot/latest-session").json()["id"] == session_id
    session = Session.objects.get(public_id=session_id)
    assert session.status == SessionStatus.OPEN and session.message_count == 1
    assert Task.objects.get(public_id=task_id).status == TaskStatus.PENDING
    assert Task.objects.count() == 1


def test_a_read_only_key_cannot_write(make_client, tenant_a, api_a):
    reader = make_client(tenant_a, ["read"])
    session_id = create_session(api_a)["id"]
    assert reader.get(f"/api/v1/sessions/{session_id}").status_code == 200
    response = reader.post(f"/api/v1/sessions/{session_id}/messages", {"role": "user"}, format="json")
    assert response.status_code == 403
    assert Message.objects.count() == 0


def test_anonymous_is_refused(anon):
    response = anon.get("/api/v1/sessions")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"


# --- one list envelope ---------------------------------------------------------------------------


def test_every_list_answers_items_and_next_and_keeps_the_old_name(api_a, api_b):
    first, second = create_session(api_a, "pager"), create_session(api_a, "pager")
    for text in ["one", "two", "three"]:
        assert append(api_a, second["id"], {"role": "user", "content": text}).status_code == 201
    for body in [{"session": first["id"]}, {"session": second["id"]}]:
        assert api_a.post("/api/v1/tasks", body, format="json").status_code == 201

    sessions = api_a.get("/api/v1/sessions?agent=pager&limit=1").json()
    assert [s["id"] for s in sessions["items"]] == [second["id"]]
    assert sessions["next"] and sessions["next_cursor"] == sessions["next"]
    rest = api_a.get(f"/api/v1/sessions?agent=pager&limit=1&cursor={sessions['next']}").json()
    assert [s["id"] for s in rest["items"]] == [first["id"]] and rest["next"] is None

    tasks = api_a.get("/api/v1/tasks?limit=1").json()
    assert [t["session"] for t in tasks["items"]] == [second["id"]] and tasks["next"] == tasks["next_cursor"]

    messages = api_a.get(f"/api/v1/sessions/{second['id']}/messages?limit=2").json()
    assert [m["content"] for m in messages["items"]] == ["one", "two"]
    assert messages["next"] == messages["next_after"] == 2
    last = api_a.get(f"/api/v1/sessions/{second['id']}/messages?after={messages['next']}").json()
    assert [m["content"] for m in last["items"]] == ["three"] and last["next"] is None

    events = api_a.get("/api/v1/agents/pager/events?limit=1").json()
    assert len(events["items"]) == 1 and events["next"] == events["next_after"] == events["items"][0]["seq"]

    assert api_b.get("/api/v1/sessions?agent=pager").json() == {
        "items": [],
        "next": None,
        "next_cursor": None,
    }
    assert api_b.get(f"/api/v1/sessions/{second['id']}/messages").status_code == 404
