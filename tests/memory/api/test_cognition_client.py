"""The cognition methods of ctxapp.client against a live server: shapes and error mapping."""

from __future__ import annotations

import pytest

from ctxapp.client import Client, Conflict, Forbidden, NotFound, ValidationFailed
from memory.models import IpcReceipt, PrivateContext, TaskContext

pytestmark = pytest.mark.django_db(transaction=True)

STATE = {"schema_version": 1, "context": {"goal": "g", "constraints": []}, "working_memory": {"n": 1}}


@pytest.fixture
def ctx(live_server, tenant_a, make_client):
    with Client(live_server.url, make_client(tenant_a).secret, retries=0) as client:
        yield client


def test_state_checkpoints_diff_and_restore_through_the_client(ctx):
    ctx.event_emit("a", "agent.started", {})
    ctx.event_emit("b", "agent.started", {})
    assert ctx.state_put("a", STATE)["version"] == 1
    first = ctx.checkpoint_create("a", reason="one", step=1)
    ctx.checkpoint_create("a", reason="two", state={**STATE, "working_memory": {"n": 2}})
    assert ctx.checkpoint_get("a", first["id"])["state"]["working_memory"] == {"n": 1}
    diff = ctx.checkpoint_diff("a", 1, 2)
    assert [(c["path"], c["old"], c["new"]) for c in diff["changes"]] == [("/working_memory/n", 1, 2)]
    restored = ctx.state_restore("a", 1)
    assert restored["state"]["working_memory"] == {"n": 1} and restored["checkpoint"]["seq"] == 3
    assert [c["seq"] for c in ctx.checkpoints_list("a")["items"]] == [3, 2, 1]
    assert ctx.reducers_put("a", [{"event_type": "agent.x", "op": "append", "target": "xs"}])["reducers"]
    assert ctx.reducers_get("a")["reducers"][0]["op"] == "append"
    with pytest.raises(ValidationFailed) as bad:
        ctx.state_put("a", {**STATE, "decision": 5})
    assert bad.value.code == "invalid_state" and bad.value.status == 400
    with pytest.raises(ValidationFailed) as future:
        ctx.state_put("a", {**STATE, "schema_version": 9})
    assert future.value.code == "schema_version_unsupported" and future.value.status == 422
    with pytest.raises(Conflict) as stale:
        ctx.state_put("a", STATE, expected_version=1)
    assert stale.value.code == "version_conflict"
    with pytest.raises(NotFound):
        ctx.checkpoint_get("a", 99)


def test_task_layers_through_the_client(ctx, tenant_a):
    ctx.event_emit("a", "agent.started", {})
    ctx.event_emit("b", "agent.started", {})
    task = ctx.task_create(agent="a", title="pair work")["id"]
    assert ctx.shared_context_put(task, as_agent="a", goal="ship", constraints=["fast"])["version"] == 1
    patched = ctx.shared_context_patch(task, as_agent="b", append={"decisions": ["d1"]}, expected_version=1)
    assert patched["decisions"] == ["d1"] and patched["updated_by"] == "b"
    assert ctx.shared_context_get(task)["goal"] == "ship"
    ctx.private_context_put(task, {"mine": "a"}, as_agent="a")
    assert ctx.private_context_get(task, as_agent="b")["data"] == {}
    sent = ctx.task_message_send(task, {"hi": 1}, as_agent="a", to="b")
    assert (
        ctx.task_messages_list(task, as_agent="b", box="inbox", unread=True)["items"][0]["id"] == sent["id"]
    )
    assert ctx.task_messages_mark_read(task, as_agent="b") == {"marked_read": 1}
    view = ctx.context_view("a", task)
    assert view["private"]["data"] == {"mine": "a"} and view["shared"]["decisions"] == ["d1"]
    recovered = ctx.recovered_state("a", as_agent="a")
    assert recovered["tasks"][0]["private_context"]["data"] == {"mine": "a"}
    with pytest.raises(Forbidden) as refused:
        ctx.request("GET", "/agents/a/context-view", params={"task": task, "as_agent": "b"})
    assert refused.value.code == "agent_mismatch"
    assert TaskContext.objects.get().version == 2
    assert PrivateContext.objects.count() == 1 and IpcReceipt.objects.count() == 1
