"""DELETE /agents/{agent} (the agent and everything kept under it) and GET /agents by prefix or name."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from memory.models import Agent, Checkpoint, CognitiveState, Event, Message, Session
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db

STATE = {"schema_version": 1, "working_memory": {"draft": "Hello"}}


def _create(api: APIClient, agent: str) -> None:
    """The agent comes into being with its first event."""
    assert (
        api.post(f"/api/v1/agents/{agent}/events", {"type": "agent.tool.called"}, format="json").status_code
        == 201
    )


def _fill(api: APIClient, agent: str) -> None:
    _create(api, agent)
    assert api.post(f"/api/v1/agents/{agent}/checkpoints", {"state": STATE}, format="json").status_code == 201
    session = api.post("/api/v1/sessions", {"agent": agent}, format="json").json()["id"]
    sent = api.post(f"/api/v1/sessions/{session}/messages", {"role": "user", "content": "hi"}, format="json")
    assert sent.status_code in (200, 201), sent.content


def test_deleting_an_agent_removes_what_it_kept_and_its_stream(api_a, tenant_a):
    _fill(api_a, "doomed")
    _fill(api_a, "kept")
    response = api_a.delete("/api/v1/agents/doomed")
    assert response.status_code == 204, response.content
    assert not Agent.objects.filter(external_id="doomed").exists()
    assert not Event.objects.filter(stream="agent:doomed").exists()
    assert set(Agent.objects.values_list("external_id", flat=True)) == {"kept"}
    assert Checkpoint.objects.count() == CognitiveState.objects.count() == Session.objects.count() == 1
    assert Message.objects.filter(session__agent__external_id="kept").count() == 1
    audit = Event.objects.get(type="agent.deleted")
    assert audit.payload["agent"] == "doomed" and audit.payload["checkpoints"] == 1
    # The same id again starts from nothing: no old event comes back.
    _create(api_a, "doomed")
    assert [e["type"] for e in api_a.get("/api/v1/agents/doomed/events").json()["items"]] == [
        "agent.tool.called"
    ]
    missing = api_a.delete("/api/v1/agents/nobody")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_another_tenants_agent_is_not_found_and_stays(api_a, api_b):
    _fill(api_a, "alices")
    response = api_b.delete("/api/v1/agents/alices")
    assert response.status_code == 404
    assert Agent.objects.filter(external_id="alices").exists()
    assert api_b.get("/api/v1/agents").json()["items"] == []


def test_agents_by_prefix_or_name_paged(api_a):
    for name in ("lg-a", "lg-b", "lg-c", "other"):
        _create(api_a, name)

    def names(page: dict) -> list[str]:
        return [agent["name"] for agent in page["items"]]

    first = api_a.get("/api/v1/agents", {"prefix": "lg-", "limit": 2}).json()
    assert names(first) == ["lg-c", "lg-b"] and first["next"]
    rest = api_a.get("/api/v1/agents", {"prefix": "lg-", "limit": 2, "cursor": first["next"]}).json()
    assert names(rest) == ["lg-a"] and rest["next"] is None
    assert names(api_a.get("/api/v1/agents", {"name": "lg-b"}).json()) == ["lg-b"]
    # No agent of that name: an empty page, not a failing request.
    missing = api_a.get("/api/v1/agents", {"name": "lg-"})
    assert missing.status_code == 200 and missing.json()["items"] == []
    bad = api_a.get("/api/v1/agents", {"limit": 0})
    assert bad.status_code == 422


def test_a_key_bound_to_an_agent_deletes_and_sees_only_its_own(api_a, tenant_a):
    _fill(api_a, "bot")
    _fill(api_a, "other")
    _, secret = api_key_create(tenant=tenant_a, name="bot", agent_external_id="bot")
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert [a["name"] for a in bound.get("/api/v1/agents").json()["items"]] == ["bot"]
    refused = bound.delete("/api/v1/agents/other")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "agent_mismatch"
    assert Agent.objects.filter(external_id="other").exists()
    assert bound.delete("/api/v1/agents/bot").status_code == 204


def test_a_read_only_key_cannot_delete(tenant_a, api_a):
    _fill(api_a, "bot")
    _, secret = api_key_create(tenant=tenant_a, name="reader", scopes=["read"])
    reader = APIClient()
    reader.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert reader.delete("/api/v1/agents/bot").status_code == 403
    assert Agent.objects.filter(external_id="bot").exists()
