"""Decay meets the context engine: restated facts open the next build; critical facts in the middle warn."""

from __future__ import annotations

from typing import Any

import pytest

from memory.models import FactReference, TrackedFact

pytestmark = pytest.mark.django_db

API = "/api/v1"


def open_session(client: Any) -> str:
    return str(
        client.post(f"{API}/sessions", {"agent": "planner", "user_id": "u-1"}, format="json").json()["id"]
    )


def play_rounds(client: Any, session_id: str, first: int, last: int) -> None:
    messages = []
    for round_ in range(first, last + 1):
        messages += [
            {"role": "user", "content": f"Round {round_}: please continue."},
            {"role": "assistant", "content": f"Continuing with round {round_}."},
        ]
    response = client.post(f"{API}/sessions/{session_id}/messages", {"messages": messages}, format="json")
    assert response.status_code == 201, response.content


def register(client: Any, session_id: str, key: str, type_: str, content: str) -> str:
    response = client.post(
        f"{API}/sessions/{session_id}/facts", {"key": key, "type": type_, "content": content}, format="json"
    )
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def build(client: Any, session_id: str, **body: Any) -> dict[str, Any]:
    response = client.post(
        f"{API}/sessions/{session_id}/context", {"input": "What next?", **body}, format="json"
    )
    assert response.status_code == 200, response.content
    return dict(response.json())


def test_restated_facts_open_the_next_built_context(api_a, tenant_a):
    session_id = open_session(api_a)
    play_rounds(api_a, session_id, 1, 1)
    budget = register(api_a, session_id, "budget", "constraint", "Budget limit is forty thousand euros")
    note = register(api_a, session_id, "office", "note", "The office coffee machine is broken")
    play_rounds(api_a, session_id, 2, 11)  # 10 rounds without a mention: the constraint decays
    report = api_a.get(f"{API}/sessions/{session_id}/facts", {"decayed": "true"}).json()
    assert [item["id"] for item in report["items"]] == [budget]

    built = build(api_a, session_id)
    first = built["messages"][0]
    assert first["role"] == "system"
    assert "Budget limit is forty thousand euros" in first["content"] and "restated" in first["content"]
    assert all("coffee" not in str(m["content"]) for m in built["messages"])
    assert note  # low importance: tracked, never pinned

    fact = TrackedFact.objects.get(public_id=budget)
    assert (fact.decayed, fact.last_referenced_round, fact.last_injected_round, fact.injection_count) == (
        False,
        11,
        11,
        1,
    )
    assert FactReference.objects.filter(fact=fact, method="restated").count() == 1
    assert api_a.get(f"{API}/sessions/{session_id}/facts", {"decayed": "true"}).json()["items"] == []
    # the next build still pins it (high importance), no longer as a restatement
    again = build(api_a, session_id)
    assert (
        "Budget limit" in again["messages"][0]["content"]
        and "restated" not in again["messages"][0]["content"]
    )


def test_a_critical_fact_forced_into_the_middle_raises_a_position_warning(api_a):
    session_id = open_session(api_a)
    play_rounds(api_a, session_id, 1, 2)
    budget = register(api_a, session_id, "budget", "constraint", "Budget limit is forty thousand euros")
    play_rounds(api_a, session_id, 3, 4)
    # a system part as long as the rest of the prompt, ahead of the pinned block, pushes the
    # critical fact to the middle
    rest = build(api_a, session_id)["budget"]["prompt_tokens"]
    preamble = "You are a careful planning assistant for the finance team. " * (rest // 11)
    built = build(api_a, session_id, system_parts=[{"name": "core", "content": preamble}])
    warnings = [w for w in built["warnings"] if w["code"] == "critical_in_middle"]
    assert [w["item"] for w in warnings] == [budget]
    offset, position = warnings[0]["offset"], warnings[0]["position"]
    assert offset > 0 and 0.30 <= position <= 0.70
    assert f"token {offset:,}" in warnings[0]["message"]


def test_without_the_long_preamble_the_fact_sits_at_the_start_and_nothing_warns(api_a):
    session_id = open_session(api_a)
    play_rounds(api_a, session_id, 1, 2)
    register(api_a, session_id, "budget", "constraint", "Budget limit is forty thousand euros")
    built = build(api_a, session_id)
    assert not [w for w in built["warnings"] if w["code"] == "critical_in_middle"]
