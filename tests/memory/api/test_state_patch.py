"""JSON Patch (RFC 6902) writes of an agent's cognitive state and checkpoints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memory.models import Checkpoint, CognitiveState, Event

pytestmark = pytest.mark.django_db

STATE = "/api/v1/agents/bot/state"
CHECKPOINTS = "/api/v1/agents/bot/checkpoints"


@pytest.fixture
def written(api_a: Any) -> dict[str, Any]:
    api_a.post("/api/v1/sessions", {"agent": "bot"}, format="json")
    body = {"schema_version": 1, "working_memory": {"notes": ["a"], "count": 1}, "decision": "start"}
    response = api_a.put(STATE, body, format="json")
    assert response.status_code == 200, response.content
    return dict(response.json())


def patch(api: Any, ops: Any, **headers: Any) -> Any:
    return api.generic("PATCH", STATE, json.dumps(ops), content_type="application/json-patch+json", **headers)


def test_a_patch_changes_only_what_it_names(api_a: Any, written: dict[str, Any]) -> None:
    response = patch(
        api_a,
        [
            {"op": "add", "path": "/working_memory/notes/-", "value": "b"},
            {"op": "replace", "path": "/working_memory/count", "value": 2},
            {"op": "test", "path": "/decision", "value": "start"},
        ],
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["working_memory"] == {"notes": ["a", "b"], "count": 2}
    assert body["decision"] == "start"
    assert body["version"] == written["version"] + 1
    assert api_a.get(STATE).json()["working_memory"]["notes"] == ["a", "b"]
    assert Event.objects.filter(type="state.updated").count() == 2


def test_a_patch_may_come_as_plain_json_with_if_match(api_a: Any, written: dict[str, Any]) -> None:
    ops = {"patch": [{"op": "remove", "path": "/working_memory/count"}]}
    stale = api_a.patch(STATE, ops, format="json", HTTP_IF_MATCH='"0"')
    assert stale.status_code == 409
    response = api_a.patch(STATE, ops, format="json", HTTP_IF_MATCH=f'"{written["version"]}"')
    assert response.status_code == 200, response.content
    assert response.json()["working_memory"] == {"notes": ["a"]}


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/decision", "value": "other"}],  # a failed test
        [{"op": "replace", "path": "/working_memory/missing", "value": 1}],  # no such path
        [{"op": "jump", "path": "/decision"}],  # no such operation
        [{"op": "add", "path": "/working_memory/x", "value": 1}, {"op": "remove", "path": "/nope"}],
        "not a list",
    ],
)
def test_a_patch_that_does_not_apply_is_422_and_changes_nothing(
    api_a: Any, written: dict[str, Any], ops: Any
) -> None:
    before = CognitiveState.objects.get(agent__external_id="bot").document
    events = Event.objects.count()
    response = patch(api_a, ops)
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] in {"invalid_patch", "validation_error"}
    assert CognitiveState.objects.get(agent__external_id="bot").document == before
    assert Event.objects.count() == events


def test_a_patch_that_yields_an_invalid_state_is_refused(api_a: Any, written: dict[str, Any]) -> None:
    response = patch(api_a, [{"op": "replace", "path": "/working_memory", "value": [1, 2]}])
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_state"
    assert api_a.get(STATE).json()["working_memory"] == {"notes": ["a"], "count": 1}


def test_a_checkpoint_with_a_patch_records_the_patched_state(api_a: Any, written: dict[str, Any]) -> None:
    first = api_a.post(CHECKPOINTS, {}, format="json").json()
    ops = [{"op": "add", "path": "/working_memory/notes/-", "value": "c"}]
    response = api_a.post(CHECKPOINTS, {"patch": ops, "reason": "step"}, format="json")
    assert response.status_code == 201, response.content
    taken = response.json()
    assert taken["seq"] == first["seq"] + 1
    state = api_a.get(f"{CHECKPOINTS}/{taken['seq']}").json()["state"]
    assert state["working_memory"]["notes"] == ["a", "c"]
    assert api_a.get(STATE).json()["working_memory"]["notes"] == ["a", "c"]


def test_a_checkpoint_with_a_bad_patch_is_422_and_takes_nothing(api_a: Any, written: dict[str, Any]) -> None:
    response = api_a.post(
        CHECKPOINTS, {"patch": [{"op": "remove", "path": "/working_memory/nope"}]}, format="json"
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_patch"
    assert Checkpoint.objects.count() == 0
    both = api_a.post(CHECKPOINTS, {"patch": [], "state": {"schema_version": 1}}, format="json")
    assert both.status_code == 422
    assert Checkpoint.objects.count() == 0


def test_patched_checkpoints_reconstruct_exactly(api_a: Any, written: dict[str, Any]) -> None:
    # A chain of patched checkpoints stored as deltas, each verified by its hash on read.
    for step in range(25):
        ops = [{"op": "add", "path": f"/working_memory/k{step}", "value": step}]
        assert api_a.post(CHECKPOINTS, {"patch": ops}, format="json").status_code == 201
    storages = list(Checkpoint.objects.order_by("seq").values_list("storage", flat=True))
    assert "delta" in storages and "full" in storages
    state = api_a.get(f"{CHECKPOINTS}/25").json()["state"]
    assert state["working_memory"]["k24"] == 24 and state["working_memory"]["notes"] == ["a"]


def test_another_tenant_cannot_patch_this_agents_state(
    api_b: Any, api_a: Any, written: dict[str, Any]
) -> None:
    response = patch(api_b, [{"op": "replace", "path": "/decision", "value": "hijack"}])
    assert response.status_code == 404
    assert api_b.post(CHECKPOINTS, {"patch": []}, format="json").status_code == 404
    assert api_a.get(STATE).json()["decision"] == "start"


def test_the_python_client_sends_patches(alice: Any) -> None:
    from ctxapp.client import ValidationFailed

    alice.session_create("bot")
    alice.state_put("bot", {"schema_version": 1, "working_memory": {"notes": []}})
    state = alice.state_patch("bot", [{"op": "add", "path": "/working_memory/notes/-", "value": "x"}])
    assert state["working_memory"]["notes"] == ["x"]
    taken = alice.checkpoint_create("bot", patch=[{"op": "replace", "path": "/decision", "value": "go"}])
    assert alice.checkpoint_get("bot", taken["seq"])["state"]["decision"] == "go"
    with pytest.raises(ValidationFailed):
        alice.state_patch("bot", [{"op": "remove", "path": "/working_memory/none"}])
