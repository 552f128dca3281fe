"""The cognition API: state, checkpoints, diff, restore, recovery, reducers and the task context layers."""

from __future__ import annotations

import dataclasses
import json

import pytest

from memory.models import (
    AgentReducer,
    Checkpoint,
    CognitiveState,
    Event,
    IpcMessage,
    IpcReceipt,
    PrivateContext,
    TaskContext,
)
from memory.services.sessions import agent_get_or_create, task_create

pytestmark = pytest.mark.django_db

STATE = {
    "schema_version": 1,
    "context": {"goal": "answer the ticket", "constraints": ["be polite"]},
    "observation": {"ticket": 42},
    "working_memory": {"draft": "Hello", "tries": 1},
    "decision": {"action": "reply"},
    "tool_state": {"search": {"page": 2}},
}


def error(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"]["code"] == code and body["error"]["message"]
    return body["error"]


@pytest.fixture
def alice_agents(tenant_a):
    return [agent_get_or_create(tenant=tenant_a, external_id=name) for name in ("agent-a", "agent-b")]


@pytest.fixture
def task_a(tenant_a, alice_agents):
    return task_create(tenant=tenant_a, agent_external_id="agent-a", title="shared work")


def as_agent(name):
    return {"HTTP_X_AGENT_ID": name}


# --- state ---------------------------------------------------------------------------------------


def test_put_then_get_state_round_trips_exactly(api_a, tenant_a, alice_agents):
    response = api_a.put("/api/v1/agents/agent-a/state", STATE, format="json")
    assert response.status_code == 200, response.content
    got = api_a.get("/api/v1/agents/agent-a/state")
    assert got.status_code == 200 and got["ETag"] == '"1"'
    body = got.json()
    for key, value in STATE.items():
        assert json.dumps(body[key]) == json.dumps(value)
    assert body["version"] == 1 and body["checkpoint"] is None and body["agent"] == "agent-a"
    assert CognitiveState.objects.get(agent__external_id="agent-a").version == 1
    assert Event.objects.filter(stream="agent:agent-a", type="state.updated").count() == 1


def test_state_of_an_agent_that_never_wrote_one_is_empty_at_version_0(api_a, alice_agents):
    body = api_a.get("/api/v1/agents/agent-a/state").json()
    assert body["version"] == 0 and body["working_memory"] == {} and body["context"]["goal"] is None


def test_legacy_state_is_upgraded_and_says_so(api_a, alice_agents):
    response = api_a.put("/api/v1/agents/agent-a/state", {"goal": "g", "memory": {"m": 1}}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["upgraded_from"] == 0 and body["schema_version"] == 1
    assert body["context"]["goal"] == "g" and body["working_memory"] == {"m": 1}


def test_wrong_type_is_400_naming_the_field_and_stores_nothing(api_a, alice_agents):
    bad = {**STATE, "working_memory": ["not", "an", "object"]}
    err = error(api_a.put("/api/v1/agents/agent-a/state", bad, format="json"), 400, "invalid_state")
    assert err["details"]["field"] == "working_memory" and "working_memory" in err["message"]
    err = error(api_a.put("/api/v1/agents/agent-a/state", [1, 2], format="json"), 400, "invalid_state")
    assert err["details"]["field"] == "state"
    assert not CognitiveState.objects.exists()
    assert not Event.objects.filter(type="state.updated").exists()


def test_future_schema_is_422_naming_both_versions_and_stores_nothing(api_a, alice_agents):
    err = error(
        api_a.put("/api/v1/agents/agent-a/state", {**STATE, "schema_version": 3}, format="json"),
        422,
        "schema_version_unsupported",
    )
    assert err["details"] == {"schema_version": 3, "supported_schema_version": 1}
    assert not CognitiveState.objects.exists()


def test_if_match_guards_the_state(api_a, alice_agents):
    api_a.put("/api/v1/agents/agent-a/state", STATE, format="json")
    stale = api_a.put("/api/v1/agents/agent-a/state", STATE, format="json", HTTP_IF_MATCH='"0"')
    assert error(stale, 409, "version_conflict")["details"] == {"expected_version": 0, "version": 1}
    ok = api_a.put("/api/v1/agents/agent-a/state?expected_version=1", STATE, format="json")
    assert ok.status_code == 200 and ok.json()["version"] == 2


def test_unknown_agent_is_404_for_reads_and_writes(api_a):
    assert error(api_a.get("/api/v1/agents/ghost/state"), 404, "not_found")["details"]["kind"] == "agent"
    error(api_a.put("/api/v1/agents/ghost/state", STATE, format="json"), 404, "not_found")
    error(api_a.post("/api/v1/agents/ghost/checkpoints", {}, format="json"), 404, "not_found")
    assert not CognitiveState.objects.exists()


# --- checkpoints, diff, restore --------------------------------------------------------------------


def test_checkpoint_list_read_diff_and_restore(api_a, tenant_a, alice_agents):
    first = api_a.post(
        "/api/v1/agents/agent-a/checkpoints",
        {"reason": "step 10", "step": 10, "produced_by": "evt_x", "state": STATE},
        format="json",
    )
    assert first.status_code == 201, first.content
    changed = {**STATE, "working_memory": {"draft": "Hello, world", "tries": 2, "sent": True}}
    second = api_a.post(
        "/api/v1/agents/agent-a/checkpoints", {"reason": "step 20", "state": changed}, format="json"
    )
    one, two = first.json(), second.json()
    assert (one["seq"], two["seq"]) == (1, 2) and one["id"].startswith("ckpt_")
    assert one["step"] == 10 and one["produced_by"] == "evt_x" and one["storage"] == "full"
    assert two["storage"] == "delta" and two["base_seq"] == 1

    page = api_a.get("/api/v1/agents/agent-a/checkpoints?limit=1").json()
    assert [c["seq"] for c in page["items"]] == [2] and page["next_cursor"]
    rest = api_a.get(f"/api/v1/agents/agent-a/checkpoints?cursor={page['next_cursor']}").json()
    assert [c["seq"] for c in rest["items"]] == [1] and rest["next_cursor"] is None
    assert page["next"] == page["next_cursor"] and rest["next"] is None  # the one list envelope

    by_seq = api_a.get("/api/v1/agents/agent-a/checkpoints/2").json()
    by_id = api_a.get(f"/api/v1/agents/agent-a/checkpoints/{two['id']}").json()
    assert by_seq == by_id and by_seq["state"]["working_memory"] == changed["working_memory"]

    diff = api_a.get(f"/api/v1/agents/agent-a/checkpoints/diff?from=1&to={two['id']}").json()
    assert diff["summary"] == {"added": 1, "removed": 0, "changed": 2}
    assert {(c["path"], c["change"]) for c in diff["changes"]} == {
        ("/working_memory/draft", "changed"),
        ("/working_memory/tries", "changed"),
        ("/working_memory/sent", "added"),
    }
    tries = next(c for c in diff["changes"] if c["path"] == "/working_memory/tries")
    assert (tries["old"], tries["new"]) == (1, 2)

    restored = api_a.post("/api/v1/agents/agent-a/state/restore", {"checkpoint": "1"}, format="json")
    assert restored.status_code == 201, restored.content
    assert restored.json()["state"]["working_memory"] == STATE["working_memory"]
    assert restored.json()["checkpoint"]["seq"] == 3
    assert api_a.get("/api/v1/agents/agent-a/state").json()["checkpoint"]["seq"] == 3
    assert Checkpoint.objects.filter(agent__external_id="agent-a").count() == 3  # history kept
    types = list(Event.objects.filter(stream="agent:agent-a").values_list("type", flat=True).order_by("seq"))
    assert types.count("checkpoint.created") == 3 and types.count("state.restored") == 1


def test_checkpoint_errors(api_a, alice_agents):
    error(api_a.get("/api/v1/agents/agent-a/checkpoints/7"), 404, "not_found")
    error(api_a.get("/api/v1/agents/agent-a/checkpoints/diff?from=1&to=2"), 404, "not_found")
    err = error(api_a.get("/api/v1/agents/agent-a/checkpoints/diff?to=2"), 422, "validation_error")
    assert "from" in err["details"]["fields"]
    error(
        api_a.post("/api/v1/agents/agent-a/state/restore", {"checkpoint": "9"}, format="json"),
        404,
        "not_found",
    )
    bad = api_a.post("/api/v1/agents/agent-a/checkpoints", {"state": {"context": 1}}, format="json")
    assert error(bad, 400, "invalid_state")["details"]["field"] == "context"
    assert not Checkpoint.objects.exists()


def test_a_retried_checkpoint_with_the_same_idempotency_key_is_taken_once(api_a, alice_agents):
    for _ in range(2):
        response = api_a.post(
            "/api/v1/agents/agent-a/checkpoints", {"state": STATE}, format="json", HTTP_IDEMPOTENCY_KEY="ck-1"
        )
        assert response.status_code == 201
    assert Checkpoint.objects.count() == 1


# --- recovery and reducers ----------------------------------------------------------------------


def test_recovered_state_folds_declared_reducers(api_a, alice_agents):
    reducers = [{"event_type": "agent.step", "op": "set", "target": "last_step", "source": "step"}]
    put = api_a.put("/api/v1/agents/agent-a/reducers", {"reducers": reducers}, format="json")
    assert put.status_code == 200 and put.json()["reducers"][0]["target"] == "last_step"
    assert api_a.get("/api/v1/agents/agent-a/reducers").json()["reducers"] == put.json()["reducers"]
    api_a.post("/api/v1/agents/agent-a/events", {"type": "agent.step", "payload": {"step": 4}}, format="json")
    api_a.post("/api/v1/agents/agent-a/checkpoints", {"state": STATE, "step": 4}, format="json")
    api_a.post("/api/v1/agents/agent-a/events", {"type": "agent.step", "payload": {"step": 5}}, format="json")
    body = api_a.get("/api/v1/agents/agent-a/recovered-state", **as_agent("agent-a")).json()
    assert body["operational"]["custom"] == {"last_step": 5}
    assert body["checkpoint"]["step"] == 4 and body["checkpoint"]["state"]["decision"] == {"action": "reply"}
    assert [e["payload"]["step"] for e in body["events_after_checkpoint"]["items"]] == [5]
    assert body["warnings"] == []
    assert Event.objects.filter(stream="agent:agent-a", type="agent.recovered").count() == 1


def test_bad_reducers_are_422_naming_the_entry(api_a, alice_agents):
    response = api_a.put(
        "/api/v1/agents/agent-a/reducers",
        {
            "reducers": [
                {"event_type": "agent.x", "op": "set", "target": "a"},
                {"event_type": "x", "op": "set", "target": "b"},
            ]
        },
        format="json",
    )
    assert "reducers[1].event_type" in error(response, 422, "validation_error")["details"]["fields"]
    response = api_a.put(
        "/api/v1/agents/agent-a/reducers",
        {"reducers": [{"event_type": "agent.x", "op": "eval", "target": "a"}]},
        format="json",
    )
    assert "reducers[0].op" in error(response, 422, "validation_error")["details"]["fields"]
    for bad, field, message in [
        ({"event_type": "session.created", "op": "set", "target": "x"}, "event_type", "start with 'agent.'"),
        ({"event_type": "agent.", "op": "set", "target": "x"}, "event_type", "start with 'agent.'"),
        ({"event_type": "agent.x", "op": "set", "target": "a..b"}, "target", "A dotted path"),
        ({"event_type": "agent.x", "op": "set", "target": "a", "source": "r."}, "source", "or empty"),
    ]:
        response = api_a.put("/api/v1/agents/agent-a/reducers", {"reducers": [bad]}, format="json")
        body = error(response, 422, "validation_error")
        assert message in body["details"]["fields"][f"reducers[0].{field}"][0]
        assert body["message"].startswith(f"reducers[0].{field}: ")
    assert not AgentReducer.objects.exists()


# --- task context layers -------------------------------------------------------------------------


def test_shared_context_put_patch_and_get(api_a, task_a, alice_agents):
    url = f"/api/v1/tasks/{task_a.public_id}/shared-context"
    put = api_a.put(
        url, {"goal": "ship", "constraints": ["tests pass"]}, format="json", **as_agent("agent-a")
    )
    assert put.status_code == 200 and put.json()["version"] == 1 and put.json()["updated_by"] == "agent-a"
    patch = api_a.patch(
        url, {"append": {"decisions": ["use postgres"]}}, format="json", **as_agent("agent-b")
    )
    assert patch.json()["decisions"] == ["use postgres"] and patch.json()["constraints"] == ["tests pass"]
    assert api_a.get(url).json() == patch.json()
    bad = api_a.patch(url, {"append": {"goal": ["x"]}}, format="json")
    assert "append" in error(bad, 422, "validation_error")["details"]["fields"]
    bad = api_a.put(url, {"constraints": "not a list"}, format="json")
    assert "constraints" in error(bad, 422, "validation_error")["details"]["fields"]
    stale = api_a.put(url, {"goal": "x"}, format="json", HTTP_IF_MATCH="1")
    error(stale, 409, "version_conflict")
    assert TaskContext.objects.get(task=task_a).version == 2
    error(api_a.get("/api/v1/tasks/task_000000000000000000000000/shared-context"), 404, "not_found")


def test_private_context_needs_the_calling_agent(api_a, task_a, alice_agents):
    url = f"/api/v1/tasks/{task_a.public_id}/private-context"
    err = error(api_a.get(url), 422, "validation_error")
    assert "X-Agent-Id" in err["details"]["fields"]
    error(api_a.get(url, **as_agent("nobody")), 404, "not_found")
    put = api_a.put(url, {"data": {"plan": "A's plan"}}, format="json", **as_agent("agent-a"))
    assert put.status_code == 200 and put.json()["version"] == 1
    assert api_a.get(f"{url}?as_agent=agent-a").json()["data"] == {"plan": "A's plan"}
    error(api_a.get(f"{url}?as_agent=agent-b", **as_agent("agent-a")), 422, "validation_error")


def test_messages_send_list_and_mark_read(api_a, task_a, alice_agents):
    url = f"/api/v1/tasks/{task_a.public_id}/messages"
    sent = api_a.post(url, {"to": "agent-b", "body": {"q": "done?"}}, format="json", **as_agent("agent-a"))
    assert sent.status_code == 201 and sent.json()["to"] == "agent-b" and sent.json()["read"] is False
    api_a.post(url, {"body": "all hands"}, format="json", **as_agent("agent-a"))
    inbox = api_a.get(f"{url}?box=inbox&unread=true", **as_agent("agent-b")).json()["items"]
    assert [m["body"] for m in inbox] == [{"q": "done?"}, "all hands"]
    marked = api_a.post(f"{url}/read", {"ids": [inbox[0]["id"]]}, format="json", **as_agent("agent-b"))
    assert marked.json() == {"marked_read": 1}
    unread = api_a.get(f"{url}?box=inbox&unread=true", **as_agent("agent-b")).json()["items"]
    assert [m["body"] for m in unread] == ["all hands"]
    assert IpcReceipt.objects.count() == 1
    error(
        api_a.post(url, {"to": "ghost", "body": "x"}, format="json", **as_agent("agent-a")), 404, "not_found"
    )
    error(api_a.post(url, {"body": "x"}, format="json"), 422, "validation_error")
    assert IpcMessage.objects.count() == 2


def test_context_view_is_only_for_the_agent_itself(api_a, task_a, alice_agents):
    api_a.put(
        f"/api/v1/tasks/{task_a.public_id}/private-context",
        {"data": {"k": "A"}},
        format="json",
        **as_agent("agent-a"),
    )
    url = f"/api/v1/agents/agent-a/context-view?task={task_a.public_id}"
    body = api_a.get(url, **as_agent("agent-a")).json()
    assert body["private"]["data"] == {"k": "A"} and body["shared"]["task"] == task_a.public_id
    error(api_a.get(url, **as_agent("agent-b")), 403, "agent_mismatch")
    error(api_a.get(url), 422, "validation_error")
    error(
        api_a.get("/api/v1/agents/agent-a/context-view?task=task_nope", **as_agent("agent-a")),
        404,
        "not_found",
    )


def test_agent_b_never_sees_agent_a_private_context_through_any_read_path(
    api_a, tenant_a, task_a, alice_agents
):
    secret = "A-ONLY-7f3c"
    api_a.put(
        f"/api/v1/tasks/{task_a.public_id}/private-context",
        {"data": {"secret": secret}},
        format="json",
        **as_agent("agent-a"),
    )
    api_a.post(
        f"/api/v1/tasks/{task_a.public_id}/messages",
        {"to": "agent-a", "body": secret},
        format="json",
        **as_agent("agent-a"),
    )  # a note to self is private too
    api_a.put("/api/v1/agents/agent-b/state", STATE, format="json")
    api_a.post("/api/v1/agents/agent-b/checkpoints", {"reason": "x"}, format="json")
    task = task_a.public_id
    reads = [
        f"/api/v1/tasks/{task}/private-context",
        f"/api/v1/tasks/{task}/shared-context",
        f"/api/v1/tasks/{task}/messages",
        f"/api/v1/tasks/{task}/messages?box=inbox",
        f"/api/v1/tasks/{task}/messages?box=sent",
        f"/api/v1/agents/agent-b/context-view?task={task}",
        "/api/v1/agents/agent-b/recovered-state",
        "/api/v1/agents/agent-a/recovered-state",
        "/api/v1/agents/agent-a/state",
        "/api/v1/agents/agent-a/checkpoints",
        "/api/v1/agents/agent-b/state",
        "/api/v1/agents/agent-b/checkpoints/1",
        "/api/v1/agents/agent-a/events",
        "/api/v1/agents/agent-b/events",
        f"/api/v1/tasks/{task}",
    ]
    for path in reads:
        response = api_a.get(path, **as_agent("agent-b"))
        assert response.status_code == 200, (path, response.content)
        assert secret not in response.content.decode(), path
    # the context view of agent-a is refused to agent-b outright
    refused = api_a.get(f"/api/v1/agents/agent-a/context-view?task={task}", **as_agent("agent-b"))
    assert refused.status_code == 403 and secret not in refused.content.decode()
    # and agent-a does see its own
    own = api_a.get("/api/v1/agents/agent-a/recovered-state?as_agent=agent-a").content.decode()
    assert secret in own


# --- cross-tenant ----------------------------------------------------------------------------------


def test_every_endpoint_answers_404_for_another_tenants_agent_or_task(
    api_a, api_b, tenant_a, task_a, alice_agents
):
    api_a.post("/api/v1/agents/agent-a/checkpoints", {"state": STATE}, format="json")
    api_a.post("/api/v1/agents/agent-a/checkpoints", {"state": STATE}, format="json")
    api_a.put(
        f"/api/v1/tasks/{task_a.public_id}/private-context",
        {"data": {"s": 1}},
        format="json",
        **as_agent("agent-a"),
    )
    api_a.post(
        f"/api/v1/tasks/{task_a.public_id}/messages",
        {"to": "agent-b", "body": "hi"},
        format="json",
        **as_agent("agent-a"),
    )
    snapshot = lambda: (  # noqa: E731
        Event.objects.count(),
        Checkpoint.objects.count(),
        CognitiveState.objects.get().version,
        TaskContext.objects.count(),
        PrivateContext.objects.count(),
        IpcMessage.objects.count(),
        IpcReceipt.objects.count(),
        AgentReducer.objects.count(),
    )
    before = snapshot()
    task = task_a.public_id
    hdr = as_agent("agent-a")
    calls = [
        ("get", "/api/v1/agents/agent-a/state", None),
        ("put", "/api/v1/agents/agent-a/state", STATE),
        ("post", "/api/v1/agents/agent-a/state/restore", {"checkpoint": "1"}),
        ("get", "/api/v1/agents/agent-a/checkpoints", None),
        ("post", "/api/v1/agents/agent-a/checkpoints", {"reason": "x"}),
        ("get", "/api/v1/agents/agent-a/checkpoints/1", None),
        ("get", "/api/v1/agents/agent-a/checkpoints/diff?from=1&to=2", None),
        ("get", "/api/v1/agents/agent-a/recovered-state", None),
        ("get", "/api/v1/agents/agent-a/reducers", None),
        ("put", "/api/v1/agents/agent-a/reducers", {"reducers": []}),
        ("get", f"/api/v1/agents/agent-a/context-view?task={task}", None),
        ("get", f"/api/v1/tasks/{task}/shared-context", None),
        ("put", f"/api/v1/tasks/{task}/shared-context", {"goal": "stolen"}),
        ("patch", f"/api/v1/tasks/{task}/shared-context", {"goal": "stolen"}),
        ("get", f"/api/v1/tasks/{task}/private-context", None),
        ("put", f"/api/v1/tasks/{task}/private-context", {"data": {"s": 2}}),
        ("get", f"/api/v1/tasks/{task}/messages", None),
        ("post", f"/api/v1/tasks/{task}/messages", {"body": "x"}),
        ("post", f"/api/v1/tasks/{task}/messages/read", {}),
    ]
    for method, path, body in calls:
        response = (
            getattr(api_b, method)(path, body, format="json", **hdr)
            if body is not None
            else getattr(api_b, method)(path, **hdr)
        )
        assert response.status_code == 404, (method, path, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert snapshot() == before


def test_an_oversized_state_is_413_naming_the_field(api_a, alice_agents, monkeypatch):
    from django.conf import settings

    monkeypatch.setattr(settings, "CTXAPP", dataclasses.replace(settings.CTXAPP, state_max_bytes=300))
    big = {**STATE, "working_memory": {"blob": "x" * 400}}
    err = error(api_a.put("/api/v1/agents/agent-a/state", big, format="json"), 413, "payload_too_large")
    assert err["details"]["field"] == "state"
    assert not CognitiveState.objects.filter(version__gt=0).exists()


def test_recovered_state_degrades_to_warnings_when_parts_miss_their_deadline(
    api_a, alice_agents, monkeypatch
):
    from django.conf import settings

    api_a.post("/api/v1/agents/agent-a/checkpoints", {"state": STATE}, format="json")
    monkeypatch.setattr(
        settings, "CTXAPP", dataclasses.replace(settings.CTXAPP, recovery_part_timeout_ms=200)
    )
    from memory.services import recovery

    real = recovery._run_part

    def slow_session(name, func, **kwargs):
        if name == "session":
            kwargs["slow"] = 3.0  # inject a pg_sleep far past the 200 ms deadline
        return real(name, func, **kwargs)

    monkeypatch.setattr(recovery, "_run_part", slow_session)
    response = api_a.get("/api/v1/agents/agent-a/recovered-state", **as_agent("agent-a"))
    assert response.status_code == 200
    body = response.json()
    assert body["session"] is None
    assert ("session", "part_timeout") in [(w["part"], w["code"]) for w in body["warnings"]]
    assert body["parts"]["session"]["ok"] is False
    assert Event.objects.filter(stream="agent:agent-a", type="agent.recovered").count() == 1
