"""The flight recorder over HTTP: agent-emitted events and reading a stream after a seq."""

from __future__ import annotations

import dataclasses

import pytest

from memory.models import Agent, Event

pytestmark = pytest.mark.django_db


def emit(api, agent, body):  # type: ignore[no-untyped-def]
    return api.post(f"/api/v1/agents/{agent}/events", body, format="json")


def test_an_agent_emits_events_and_reads_them_back_in_order(api_a, tenant_a):
    session_id = api_a.post("/api/v1/sessions", {"agent": "bot-1", "model": "gpt-4o"}, format="json").json()[
        "id"
    ]
    first = emit(
        api_a, "bot-1", {"type": "agent.tool.called", "payload": {"tool": "search"}, "session": session_id}
    )
    assert first.status_code == 201
    body = first.json()
    assert body["id"].startswith("evt_") and body["seq"] == 2 and body["stream"] == "agent:bot-1"
    assert body["session"] == session_id
    assert body["payload"]["tool"] == "search"
    assert body["payload"]["gen_ai.agent.id"] == "bot-1"
    assert body["payload"]["gen_ai.request.model"] == "gpt-4o"
    emit(api_a, "bot-1", {"type": "agent.thought", "payload": {"text": "hmm"}})
    stored = Event.objects.get(public_id=body["id"])
    assert stored.tenant == tenant_a and stored.session.public_id == session_id

    page = api_a.get("/api/v1/agents/bot-1/events").json()
    assert [(e["seq"], e["type"]) for e in page["items"]] == [
        (1, "session.created"),
        (2, "agent.tool.called"),
        (3, "agent.thought"),
    ]
    assert page["next_after"] is None
    page = api_a.get("/api/v1/agents/bot-1/events", {"after": 1, "limit": 1}).json()
    assert [e["seq"] for e in page["items"]] == [2] and page["next_after"] == 2
    only_agent = api_a.get("/api/v1/agents/bot-1/events", {"type": "agent.*"}).json()["items"]
    assert [e["type"] for e in only_agent] == ["agent.tool.called", "agent.thought"]
    two = api_a.get("/api/v1/agents/bot-1/events", {"type": "session.created,agent.thought"}).json()["items"]
    assert [e["seq"] for e in two] == [1, 3]
    of_session = api_a.get("/api/v1/agents/bot-1/events", {"session": session_id}).json()["items"]
    assert [e["seq"] for e in of_session] == [1, 2]
    other = api_a.get("/api/v1/agents/bot-1/events", {"session": "sess_000000000000000000000000"})
    assert other.status_code == 404


def test_an_agent_is_created_on_its_first_event(api_a, tenant_a):
    assert emit(api_a, "new-bot", {"type": "agent.started"}).status_code == 201
    assert Agent.objects.filter(tenant=tenant_a, external_id="new-bot").exists()


@pytest.mark.parametrize(
    "event_type", ["session.created", "agent", "agent.", "Agent.Thing", "retention.evicted", "agent..x"]
)
def test_an_agent_may_only_emit_agent_events(api_a, tenant_a, event_type):
    response = emit(api_a, "bot-1", {"type": event_type, "payload": {}})
    assert response.status_code == 422
    assert "type" in response.json()["error"]["details"]["fields"]
    assert Event.objects.count() == 0
    assert not Agent.objects.filter(tenant=tenant_a).exists()  # a refused event leaves nothing behind


def test_a_payload_over_the_limit_is_413_naming_the_field(api_a, settings):
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, event_payload_max_bytes=100)
    ok = emit(api_a, "bot-1", {"type": "agent.note", "payload": {"text": "x" * 50}})
    assert ok.status_code == 201
    too_big = emit(api_a, "bot-1", {"type": "agent.note", "payload": {"text": "x" * 200}})
    assert too_big.status_code == 413
    error = too_big.json()["error"]
    assert error["code"] == "payload_too_large" and error["details"]["field"] == "payload"
    assert error["details"]["limit_bytes"] == 100
    assert Event.objects.count() == 1
    not_an_object = emit(api_a, "bot-1", {"type": "agent.note", "payload": [1, 2]})
    assert (
        not_an_object.status_code == 422 and "payload" in not_an_object.json()["error"]["details"]["fields"]
    )


def test_an_event_may_only_name_a_session_of_its_agent(api_a):
    session_id = api_a.post("/api/v1/sessions", {"agent": "bot-1"}, format="json").json()["id"]
    response = emit(api_a, "bot-2", {"type": "agent.x", "session": session_id})
    assert response.status_code == 422 and "session" in response.json()["error"]["details"]["fields"]
    assert Event.objects.filter(type="agent.x").count() == 0


def test_an_overlong_agent_id_is_refused(api_a, tenant_a):
    response = emit(api_a, "a" * 201, {"type": "agent.x"})
    assert response.status_code == 422 and "agent" in response.json()["error"]["details"]["fields"]
    assert not Agent.objects.filter(tenant=tenant_a).exists()


def test_reading_events_of_an_unknown_agent_is_404(api_a):
    response = api_a.get("/api/v1/agents/nobody/events")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_malformed_json_is_400(api_a):
    response = api_a.post("/api/v1/agents/bot-1/events", data="{nope", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_bob_never_sees_or_writes_alices_stream(api_a, api_b, tenant_a, tenant_b):
    session_id = api_a.post("/api/v1/sessions", {"agent": "shared-name"}, format="json").json()["id"]
    emit(api_a, "shared-name", {"type": "agent.secret", "payload": {"pin": "1234"}})
    assert api_b.get("/api/v1/agents/shared-name/events").status_code == 404
    refused = emit(api_b, "shared-name", {"type": "agent.x", "session": session_id})
    assert refused.status_code == 404
    # Bob's agent of the same name is his own stream, with its own seqs.
    mine = emit(api_b, "shared-name", {"type": "agent.mine"})
    assert mine.status_code == 201 and mine.json()["seq"] == 1
    assert [e["type"] for e in api_b.get("/api/v1/agents/shared-name/events").json()["items"]] == [
        "agent.mine"
    ]
    alice = [e["type"] for e in api_a.get("/api/v1/agents/shared-name/events").json()["items"]]
    assert alice == ["session.created", "agent.secret"]
    assert Event.objects.filter(tenant=tenant_b).count() == 1
