"""POST /api/v1/sessions/{id}/compress through the HTTP API."""

from __future__ import annotations

import pytest

from memory.models import Event, Message

pytestmark = pytest.mark.django_db

API = "/api/v1"
CHATTER = "We chatted about lunch options, the weather and the weekend for quite a while. " * 5
DECISION = "Decision: retries use exponential backoff starting at 100 ms, capped at five seconds. " * 3


@pytest.fixture
def session_id(api_a):
    response = api_a.post(f"{API}/sessions", {"agent": "coder"}, format="json")
    messages = [{"role": "user", "content": CHATTER + f" {i}"} for i in range(10)]
    messages.insert(3, {"role": "assistant", "content": DECISION, "event_kind": "decision"})
    messages.insert(
        6,
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": "KeyError: 'invoice' in handler",
            "metadata": {"important": True},
        },
    )
    sid = response.json()["id"]
    assert (
        api_a.post(f"{API}/sessions/{sid}/messages", {"messages": messages}, format="json").status_code == 201
    )
    return sid


def test_it_compresses_to_the_default_ratio_and_reports_what_it_dropped(api_a, tenant_a, session_id):
    response = api_a.post(f"{API}/sessions/{session_id}/compress", {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["session"] == session_id and body["target_ratio"] == 0.3
    assert body["ratio"] <= 0.3 and body["target_met"] is True
    assert body["ratio"] == pytest.approx(body["tokens_after"] / body["tokens_before"], abs=1e-6)
    assert body["tokens_before"] == sum(
        m.token_count for m in Message.objects.filter(session__public_id=session_id)
    )
    kept = {m["seq"]: m for m in body["messages"]}
    decision = kept[4]
    assert (
        decision["category"] == "decision" and decision["content"] == DECISION and not decision["truncated"]
    )
    assert decision["priority"] == 100 + 20  # among the newest 10
    assert kept[7]["category"] == "error" and kept[7]["priority"] == 90 + 20 + 30
    assert body["dropped"] and all(d["category"] == "conversation" for d in body["dropped"])
    assert sorted([*kept, *(d["seq"] for d in body["dropped"])]) == list(range(1, 13))
    assert sum(m["tokens"] for m in body["messages"]) == body["tokens_after"]
    assert Message.objects.filter(session__public_id=session_id).count() == 12  # nothing deleted
    assert Event.objects.filter(tenant=tenant_a, type="session.compressed").count() == 1


def test_it_takes_a_ratio_and_a_range(api_a, session_id):
    body = api_a.post(
        f"{API}/sessions/{session_id}/compress", {"target_ratio": 0.6, "up_to_seq": 8}, format="json"
    ).json()
    assert body["target_ratio"] == 0.6 and body["ratio"] <= 0.6
    assert max([m["seq"] for m in body["messages"]] + [d["seq"] for d in body["dropped"]]) == 8


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"target_ratio": 0}, "target_ratio"),
        ({"target_ratio": 1.5}, "target_ratio"),
        ({"up_to_seq": 0}, "up_to_seq"),
    ],
)
def test_bad_input_is_422_naming_the_field(api_a, tenant_a, session_id, body, field):
    response = api_a.post(f"{API}/sessions/{session_id}/compress", body, format="json")
    assert response.status_code == 422
    assert field in response.json()["error"]["details"]["fields"]
    assert not Event.objects.filter(tenant=tenant_a, type="session.compressed").exists()


def test_bob_cannot_compress_alices_session(api_b, tenant_a, session_id):
    response = api_b.post(f"{API}/sessions/{session_id}/compress", {}, format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert not Event.objects.filter(type="session.compressed").exists()
