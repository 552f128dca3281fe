"""Sessions the application names: a key per agent, every session route by agent and key, and
the agents list (GET /api/v1/agents)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from memory.models import Event, Session
from memory.services.sessions import session_open
from memory.services.tenancy import api_key_create
from tests.helpers import run_together

pytestmark = pytest.mark.django_db

BY_KEY = "/api/v1/sessions/by-key"


def _open(api: APIClient, agent: str, key: str, **fields) -> tuple[int, dict]:
    response = api.post("/api/v1/sessions", {"agent": agent, "key": key, **fields}, format="json")
    return response.status_code, response.json()


def test_a_key_names_one_session_per_agent_and_a_repeat_returns_it(api_a) -> None:
    status, first = _open(api_a, "support-bot", "conv-r1", user_id="u1")
    assert status == 201 and first["key"] == "conv-r1"
    again_status, again = _open(api_a, "support-bot", "conv-r1", user_id="someone else")
    assert again_status == 200
    assert again == first  # unchanged: the repeat writes nothing
    assert Event.objects.filter(type="session.created").count() == 1
    other_status, other = _open(api_a, "billing-bot", "conv-r1")  # unique per agent, not per tenant
    assert other_status == 201 and other["id"] != first["id"]
    plain = api_a.post("/api/v1/sessions", {"agent": "support-bot"}, format="json").json()
    assert plain["key"] is None


def test_every_session_route_takes_the_agent_and_key_instead_of_the_id(api_a) -> None:
    _, session = _open(api_a, "support-bot", "conv / r1 ?&")  # any string: it travels in the query
    query = {"agent": "support-bot", "key": "conv / r1 ?&"}
    appended = api_a.post(
        f"{BY_KEY}/messages?agent=support-bot&key=conv%20%2F%20r1%20%3F%26",
        {"role": "user", "content": "My deploy fails on a full disk."},
        format="json",
    )
    assert appended.status_code == 201, appended.content
    listed = api_a.get(f"{BY_KEY}/messages", query)
    assert [m["content"] for m in listed.json()["items"]] == ["My deploy fails on a full disk."]
    assert api_a.get(BY_KEY, query).json()["id"] == session["id"]
    built = api_a.post(
        f"{BY_KEY}/context?agent=support-bot&key=conv%20%2F%20r1%20%3F%26",
        {"input": "and now?"},
        format="json",
    )
    assert built.status_code == 200, built.content
    assert "My deploy fails on a full disk." in str(built.json()["messages"])
    ended = api_a.post(f"{BY_KEY}/end?agent=support-bot&key=conv%20%2F%20r1%20%3F%26")
    assert ended.status_code == 200 and ended.json()["status"] == "ended"
    assert Session.objects.get(public_id=session["id"]).status == "ended"


def test_a_key_without_its_agent_or_of_another_tenant_answers_like_a_missing_session(api_a, api_b) -> None:
    _open(api_a, "support-bot", "conv-r1")
    missing = api_a.get(BY_KEY, {"agent": "support-bot", "key": "conv-r2"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    foreign = api_b.get(BY_KEY, {"agent": "support-bot", "key": "conv-r1"})
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
    incomplete = api_a.get(f"{BY_KEY}/messages", {"key": "conv-r1"})
    assert incomplete.status_code == 422
    assert list(incomplete.json()["error"]["details"]["fields"]) == ["agent"]


def test_a_key_bound_to_an_agent_cannot_reach_another_agents_session_by_key(tenant_a, api_a) -> None:
    _open(api_a, "agent-a", "conv-r1")
    _, secret = api_key_create(tenant=tenant_a, name="b", agent_external_id="agent-b")
    key_b = APIClient()
    key_b.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    refused = key_b.post(f"{BY_KEY}/messages?agent=agent-a&key=conv-r1", {"role": "user", "content": "x"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "agent_mismatch"
    assert Session.objects.get(key="conv-r1").message_count == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_opens_of_one_key_make_one_session(tenant_a) -> None:
    def open_it() -> tuple[str, bool]:
        session, created = session_open(tenant=tenant_a, agent_external_id="bot", key="conv-r1")
        return session.public_id, created

    results, errors = run_together([open_it] * 4)
    assert errors == []
    assert len({public_id for public_id, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert Session.objects.filter(tenant=tenant_a, key="conv-r1").count() == 1


# --- the agents list -----------------------------------------------------------------------------


def test_agents_list_pages_with_session_counts_and_last_activity(api_a, api_b) -> None:
    for agent, sessions in (("planner", 2), ("coder", 1), ("reviewer", 0)):
        for _ in range(sessions):
            api_a.post("/api/v1/sessions", {"agent": agent}, format="json")
    api_a.post("/api/v1/agents/reviewer/events", {"type": "agent.note"}, format="json")  # no session
    api_b.post("/api/v1/sessions", {"agent": "bobs-bot"}, format="json")

    first = api_a.get("/api/v1/agents", {"limit": 2}).json()
    assert [a["name"] for a in first["items"]] == ["reviewer", "coder"]  # newest first
    assert first["next"]
    second = api_a.get("/api/v1/agents", {"limit": 2, "cursor": first["next"]}).json()
    assert [a["name"] for a in second["items"]] == ["planner"] and second["next"] is None
    by_name = {a["name"]: a for a in first["items"] + second["items"]}
    assert {n: a["session_count"] for n, a in by_name.items()} == {"reviewer": 0, "coder": 1, "planner": 2}
    latest = Session.objects.filter(agent__external_id="planner").latest("last_accessed_at")
    assert by_name["planner"]["last_active_at"] == latest.last_accessed_at.isoformat()
    assert by_name["reviewer"]["last_active_at"] is None

    one = api_a.get("/api/v1/agents/planner")
    assert one.status_code == 200 and one.json() == by_name["planner"]
    assert api_a.get("/api/v1/agents/bobs-bot").status_code == 404


def test_a_bound_key_lists_only_its_agent(tenant_a, api_a) -> None:
    for agent in ("agent-a", "agent-b"):
        api_a.post("/api/v1/sessions", {"agent": agent}, format="json")
    _, secret = api_key_create(tenant=tenant_a, name="b", agent_external_id="agent-b")
    key_b = APIClient()
    key_b.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert [a["name"] for a in key_b.get("/api/v1/agents").json()["items"]] == ["agent-b"]
    assert key_b.get("/api/v1/agents/agent-a").status_code == 403


def test_the_python_client_opens_a_session_by_its_key_once(alice) -> None:
    first = alice.session_create("support-bot", key="conv-r1", user_id="u1")
    again = alice.session_create("support-bot", key="conv-r1")
    assert first["key"] == "conv-r1" and again["id"] == first["id"]
    assert Session.objects.filter(key="conv-r1").count() == 1
    assert [a["name"] for a in alice.agents_list()["items"]] == ["support-bot"]
    assert alice.agent_get("support-bot")["session_count"] == 1
