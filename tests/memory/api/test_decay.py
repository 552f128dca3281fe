"""Tracked facts and the decay report through the HTTP API.

The scripted conversation: 60 rounds (a user and an assistant message each), six facts of mixed
importance, referenced at planned rounds; the decay report is checked at several rounds.
"""

from __future__ import annotations

from typing import Any

import pytest

from memory.models import Event, FactReference, TrackedFact
from tests.helpers import in_process_transport

pytestmark = pytest.mark.django_db

API = "/api/v1"


def create_session(client: Any, *, user_id: str = "u-1") -> str:
    response = client.post(f"{API}/sessions", {"agent": "planner", "user_id": user_id}, format="json")
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def append(client: Any, session_id: str, role: str, content: str, **fields: Any) -> dict[str, Any]:
    response = client.post(
        f"{API}/sessions/{session_id}/messages", {"role": role, "content": content, **fields}, format="json"
    )
    assert response.status_code == 201, response.content
    return dict(response.json())


def register(client: Any, session_id: str, key: str, type_: str, content: str) -> dict[str, Any]:
    response = client.post(
        f"{API}/sessions/{session_id}/facts", {"key": key, "type": type_, "content": content}, format="json"
    )
    assert response.status_code == 201, response.content
    return dict(response.json())


def report(client: Any, session_id: str) -> dict[str, Any]:
    response = client.get(f"{API}/sessions/{session_id}/facts", {"decayed": "true"})
    assert response.status_code == 200, response.content
    return dict(response.json())


# The plan. Rounds are user turns; "refs" are rounds whose user message mentions the fact.
FACTS = {
    "A": ("budget", "constraint", "Budget limit is forty thousand euros", "high"),
    "B": ("migration", "goal", "Migrate the billing service to PostgreSQL", "high"),
    "C": ("cache", "decision", "Use Redis for session caching", "medium"),
    "D": ("sprint", "state", "Current sprint state: invoices export is half done", "medium"),
    "E": ("office", "note", "The office coffee machine is broken", "low"),
}
REGISTER_AT = {"A": 1, "E": 1, "B": 2, "C": 3, "D": 10}
MENTIONS = {
    5: "Remember the budget limit of forty thousand euros.",
    15: "The coffee machine in the office is still broken.",
    20: "We keep Redis for session caching, as decided.",
    30: "Remember the budget limit of forty thousand euros.",
    34: "The coffee machine in the office is still broken.",
}
EXPLICIT_REFERENCE = {8: "B"}
PREFERENCE_AT = 12  # F: auto-registered from a message with event_kind "preference"
PREFERENCE_TEXT = "I prefer short bullet point answers"
PREFERENCE_REFS = range(17, 60, 5)  # 17, 22, …, 57: never 10 rounds without a mention
EXPECTED = {
    9: [],
    10: [],
    15: ["A"],
    18: ["A", "B"],
    25: ["A", "B"],
    30: ["B", "D"],
    40: ["A", "B", "C", "D"],
    55: ["A", "B", "C", "D", "E"],
    60: ["A", "B", "C", "D", "E"],
}


def play_round(api, session_id: str, round_: int, ids: dict[str, str]) -> None:
    """One round of the script: the user's line, facts registered or referenced, the answer."""
    if round_ == PREFERENCE_AT:
        append(api, session_id, "user", PREFERENCE_TEXT, event_kind="preference")
    elif round_ in PREFERENCE_REFS:
        append(api, session_id, "user", "Keep answers short, in bullet points as I prefer.")
    else:
        append(api, session_id, "user", MENTIONS.get(round_, f"Round {round_}: please continue."))
    for name in [name for name, at in REGISTER_AT.items() if at == round_]:
        key, type_, content, importance = FACTS[name]
        fact = register(api, session_id, key, type_, content)
        assert fact["importance"] == importance
        assert fact["registered_round"] == round_
        ids[name] = fact["id"]
    if round_ in EXPLICIT_REFERENCE:
        name = EXPLICIT_REFERENCE[round_]
        response = api.post(f"{API}/sessions/{session_id}/facts/{ids[name]}/reference", {}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["last_referenced_round"] == round_
    append(api, session_id, "assistant", f"Continuing with round {round_}.")


def assert_final_report(snapshot: dict[str, Any], names: dict[str, str]) -> None:
    final = {names[item["id"]]: item for item in snapshot["items"]}
    assert final["A"]["decayed_round"] == 40
    assert final["A"]["last_referenced_round"] == 30
    assert {name: final[name]["decayed_round"] for name in "BCDE"} == {"B": 18, "C": 40, "D": 30, "E": 54}
    assert (final["A"]["threshold"], final["C"]["threshold"]) == (10, 20)
    assert {name: item["recommendation"] for name, item in final.items()} == {
        "A": "restate_now",
        "B": "restate_now",
        "C": "consider_restating",
        "D": "consider_restating",
        "E": "no_action",
    }
    # most urgent first: high importance, then the longest unreferenced
    assert [names[item["id"]] for item in snapshot["items"]] == ["B", "A", "D", "C", "E"]


def assert_stored_decay(tenant, names: dict[str, str]) -> None:
    # one fact.decayed event per crossing: A crossed twice (rounds 15 and 40), F never
    decayed_events = Event.objects.filter(tenant=tenant, type="fact.decayed")
    per_fact: dict[str, list[int]] = {}
    for event in decayed_events.order_by("seq"):
        per_fact.setdefault(names[event.payload["fact"]], []).append(event.payload["decayed_round"])
    assert per_fact == {"A": [15, 40], "B": [18], "C": [40], "D": [30], "E": [54]}
    stored = {names[f.public_id]: f for f in TrackedFact.objects.filter(tenant=tenant)}
    assert (stored["A"].decay_count, stored["F"].decay_count) == (2, 0)
    preference = stored["F"]
    assert (preference.fact_type, preference.importance) == ("user_preference", "high")
    assert (preference.registered_round, preference.last_referenced_round) == (PREFERENCE_AT, 57)
    assert preference.reference_count == 1 + len(PREFERENCE_REFS)


def test_a_scripted_60_round_conversation_yields_the_planned_decay_reports(api_a, tenant_a):
    session_id = create_session(api_a)
    ids: dict[str, str] = {}
    snapshots: dict[int, dict[str, Any]] = {}
    for round_ in range(1, 61):
        play_round(api_a, session_id, round_, ids)
        if round_ in EXPECTED:
            snapshots[round_] = report(api_a, session_id)
    ids["F"] = TrackedFact.objects.get(tenant=tenant_a, source="message").public_id
    names = {fact_id: name for name, fact_id in ids.items()}

    for round_, expected in EXPECTED.items():
        body = snapshots[round_]
        assert body["round"] == round_
        listed = sorted(names[item["id"]] for item in body["items"])
        assert listed == expected, f"round {round_}: {listed} != {expected}"
        assert all(item["decayed"] for item in body["items"])
    assert_final_report(snapshots[60], names)
    assert_stored_decay(tenant_a, names)

    # the full list (no filter) has all six, fresh ones after the decayed ones
    full = api_a.get(f"{API}/sessions/{session_id}/facts").json()
    assert len(full["items"]) == 6
    assert names[full["items"][-1]["id"]] == "F"
    assert full["items"][-1]["recommendation"] == "no_action"
    fresh = api_a.get(f"{API}/sessions/{session_id}/facts", {"decayed": "false"}).json()
    assert [names[item["id"]] for item in fresh["items"]] == ["F"]

    # round 60's build restates the decayed high-importance facts at the very start (oldest
    # reference first), then pins the fresh high-importance one; medium and low stay out
    response = api_a.post(f"{API}/sessions/{session_id}/context", {"input": "What next?"}, format="json")
    assert response.status_code == 200, response.content
    messages = response.json()["messages"]
    opening = [m["content"] for m in messages[:3]]
    assert FACTS["B"][2] in opening[0] and "restated" in opening[0]
    assert FACTS["A"][2] in opening[1] and "restated" in opening[1]
    assert PREFERENCE_TEXT in opening[2] and "restated" not in opening[2]
    everything = " ".join(str(m["content"]) for m in messages)
    assert [name for name in "CDE" if FACTS[name][2] in everything] == []
    after = report(api_a, session_id)
    assert sorted(names[item["id"]] for item in after["items"]) == ["C", "D", "E"]
    restated = TrackedFact.objects.get(public_id=ids["A"])
    assert (restated.last_referenced_round, restated.last_injected_round) == (60, 60)


def test_registering_an_existing_key_updates_it_and_counts_as_a_reference(api_a, tenant_a):
    session_id = create_session(api_a)
    append(api_a, session_id, "user", "Hello there.")
    first = register(api_a, session_id, "db", "decision", "Use SQLite for storage")
    append(api_a, session_id, "user", "Next question.")
    response = api_a.post(
        f"{API}/sessions/{session_id}/facts",
        {"key": "db", "type": "constraint", "content": "Use PostgreSQL for storage"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"] == first["id"]
    assert body["importance"] == "high" and body["content"] == "Use PostgreSQL for storage"
    assert body["registered_round"] == 1 and body["last_referenced_round"] == 2
    fact = TrackedFact.objects.get(public_id=first["id"])
    assert fact.reference_count == 2 and fact.content == "Use PostgreSQL for storage"
    types = list(
        Event.objects.filter(tenant=tenant_a, type__startswith="fact.").values_list("type", flat=True)
    )
    assert types == ["fact.registered", "fact.updated"]


def test_auto_registration_uses_the_event_kind_and_the_fact_key_metadata(api_a, tenant_a):
    session_id = create_session(api_a)
    append(api_a, session_id, "user", "Let us pick a queue.")
    message = append(
        api_a,
        session_id,
        "assistant",
        "We will use Celery with Redis as the broker.",
        event_kind="decision",
        metadata={"fact_key": "queue"},
    )
    append(api_a, session_id, "user", "Never store card numbers in logs.", event_kind="constraint")
    facts = {f.key: f for f in TrackedFact.objects.filter(tenant=tenant_a)}
    assert set(facts) == {"queue", "constraint:store-card-numbers-logs"}
    queue = facts["queue"]
    assert (queue.fact_type, queue.importance, queue.source, queue.source_seq) == (
        "decision",
        "medium",
        "message",
        message["seq"],
    )
    assert queue.registered_round == 1
    assert facts["constraint:store-card-numbers-logs"].importance == "high"
    assert facts["constraint:store-card-numbers-logs"].registered_round == 2
    listed = api_a.get(f"{API}/sessions/{session_id}/facts").json()["items"]
    assert {item["key"] for item in listed} == set(facts)
    assert {item["source"] for item in listed} == {"message"}
    assert {item["source_seq"] for item in listed} == {message["seq"], message["seq"] + 1}


def test_a_retried_registration_with_the_same_idempotency_key_counts_once(api_a, tenant_a):
    session_id = create_session(api_a)
    body = {"key": "budget", "type": "constraint", "content": "Budget limit is forty thousand euros"}
    first = api_a.post(
        f"{API}/sessions/{session_id}/facts", body, format="json", HTTP_IDEMPOTENCY_KEY="reg-1"
    )
    again = api_a.post(
        f"{API}/sessions/{session_id}/facts", body, format="json", HTTP_IDEMPOTENCY_KEY="reg-1"
    )
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.json()["id"] == first.json()["id"]
    assert TrackedFact.objects.get(tenant=tenant_a).reference_count == 1
    assert Event.objects.filter(tenant=tenant_a, type__startswith="fact.").count() == 1


def test_a_fact_detail_shows_its_reference_history(api_a):
    session_id = create_session(api_a)
    append(api_a, session_id, "user", "Start.")
    fact = register(api_a, session_id, "budget", "constraint", "Budget limit is forty thousand euros")
    append(api_a, session_id, "user", "Is the forty thousand euros budget limit firm?")
    api_a.post(
        f"{API}/sessions/{session_id}/facts/{fact['id']}/reference", {"note": "checked"}, format="json"
    )
    body = api_a.get(f"{API}/sessions/{session_id}/facts/{fact['id']}").json()
    assert [(r["method"], r["round"]) for r in body["references"]] == [
        ("explicit", 2),
        ("key_terms", 2),
        ("registered", 1),
    ]
    assert body["reference_count"] == 3


def test_deleting_a_fact_stops_tracking_it(api_a, tenant_a):
    session_id = create_session(api_a)
    fact = register(api_a, session_id, "k", "goal", "Ship the reporting feature")
    response = api_a.delete(f"{API}/sessions/{session_id}/facts/{fact['id']}")
    assert response.status_code == 204
    assert not TrackedFact.objects.filter(public_id=fact["id"]).exists()
    assert Event.objects.filter(tenant=tenant_a, type="fact.deleted", payload__fact=fact["id"]).exists()
    assert api_a.get(f"{API}/sessions/{session_id}/facts/{fact['id']}").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "goal", "content": "x"}, "key"),
        ({"key": "k", "content": "x"}, "type"),
        ({"key": "k", "type": "Not A Type!", "content": "x"}, "type"),
        ({"key": "k", "type": "goal"}, "content"),
        ({"key": "k", "type": "goal", "content": "x", "scope": "galaxy"}, "scope"),
    ],
)
def test_bad_fact_input_is_422_naming_the_field(api_a, body, field):
    session_id = create_session(api_a)
    response = api_a.post(f"{API}/sessions/{session_id}/facts", body, format="json")
    assert response.status_code == 422, response.content
    assert field in response.json()["error"]["details"]["fields"]
    assert not TrackedFact.objects.exists()


def test_an_ended_session_takes_no_new_facts_or_references(api_a, tenant_a):
    session_id = create_session(api_a)
    fact = register(api_a, session_id, "budget", "constraint", "Budget limit is forty thousand euros")
    assert api_a.post(f"{API}/sessions/{session_id}/end", format="json").status_code == 200
    response = api_a.post(
        f"{API}/sessions/{session_id}/facts", {"key": "k", "type": "goal", "content": "x"}, format="json"
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "session_ended"
    response = api_a.post(f"{API}/sessions/{session_id}/facts/{fact['id']}/reference", {}, format="json")
    assert response.status_code == 409
    assert TrackedFact.objects.filter(tenant=tenant_a).count() == 1
    assert TrackedFact.objects.get(public_id=fact["id"]).reference_count == 1
    # the report and compression still answer for an ended session
    assert api_a.get(f"{API}/sessions/{session_id}/facts").status_code == 200
    assert api_a.post(f"{API}/sessions/{session_id}/compress", {}, format="json").status_code == 200


def test_unknown_session_or_fact_is_404(api_a):
    session_id = create_session(api_a)
    assert api_a.get(f"{API}/sessions/sess_{'0' * 24}/facts").status_code == 404
    missing = f"{API}/sessions/{session_id}/facts/fact_{'0' * 24}"
    assert api_a.get(missing).status_code == 404
    assert api_a.post(f"{missing}/reference", {}, format="json").json()["error"]["code"] == "not_found"


def test_bob_can_touch_none_of_alices_facts(api_a, api_b, tenant_a):
    """Every endpoint of this capability answers Bob's requests for Alice's ids with 404."""
    session_id = create_session(api_a)
    append(api_a, session_id, "user", "Start.")
    fact = register(api_a, session_id, "budget", "constraint", "Budget limit is forty thousand euros")
    before = TrackedFact.objects.get(public_id=fact["id"])
    events_before = Event.objects.filter(tenant=tenant_a).count()
    base = f"{API}/sessions/{session_id}"
    attempts = [
        api_b.get(f"{base}/facts"),
        api_b.get(f"{base}/facts", {"decayed": "true"}),
        api_b.post(f"{base}/facts", {"key": "evil", "type": "goal", "content": "x"}, format="json"),
        api_b.get(f"{base}/facts/{fact['id']}"),
        api_b.post(f"{base}/facts/{fact['id']}/reference", {}, format="json"),
        api_b.delete(f"{base}/facts/{fact['id']}"),
        api_b.post(f"{base}/compress", {"target_ratio": 0.5}, format="json"),
    ]
    for response in attempts:
        assert response.status_code == 404, response.content
        assert response.json()["error"]["code"] == "not_found"
    # Bob's own session does not reach Alice's fact either
    bob_session = create_session(api_b, user_id="u-bob")
    response = api_b.post(f"{API}/sessions/{bob_session}/facts/{fact['id']}/reference", {}, format="json")
    assert response.status_code == 404
    after = TrackedFact.objects.get(public_id=fact["id"])
    assert (after.reference_count, after.last_referenced_round) == (before.reference_count, 1)
    assert TrackedFact.objects.count() == 1
    assert not FactReference.objects.filter(method="explicit").exists()
    assert Event.objects.filter(tenant=tenant_a).count() == events_before


def test_the_python_client_covers_facts_and_compression(api_a, tenant_a):
    from ctxapp.client import Client, NotFound

    session_id = create_session(api_a)
    with (
        in_process_transport() as transport,
        Client("http://testserver", api_key=api_a.secret, transport=transport, retries=0) as ctx,
    ):
        ctx.message_append(session_id, role="user", content="Start.")
        fact = ctx.fact_register(
            session_id, key="budget", type="constraint", content="Budget is forty thousand"
        )
        assert fact["importance"] == "high" and fact["registered_round"] == 1
        assert ctx.fact_reference(session_id, fact["id"], note="checked")["reference_count"] == 2
        assert ctx.fact_get(session_id, fact["id"])["references"][0]["method"] == "explicit"
        assert [f["id"] for f in ctx.facts_list(session_id)["items"]] == [fact["id"]]
        assert ctx.decay_report(session_id)["items"] == []
        compressed = ctx.session_compress(session_id, target_ratio=0.5)
        assert compressed["tokens_before"] > 0 and compressed["ratio"] <= 1.0
        ctx.fact_delete(session_id, fact["id"])
        with pytest.raises(NotFound):
            ctx.fact_get(session_id, fact["id"])
    assert not TrackedFact.objects.filter(tenant=tenant_a).exists()
