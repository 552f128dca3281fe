"""Recovery: the fold (deterministic, pure), declared reducers, the recovered state and its deadlines."""

from __future__ import annotations

import copy
import json

import pytest
from django.db import transaction

from memory.api.shapes import recovered_state_out
from memory.models import Checkpoint, Event
from memory.services import cognition, layers, recorder, recovery
from memory.services.sessions import (
    MessageInput,
    agent_get_or_create,
    messages_append,
    session_create,
    task_create,
    task_update,
)
from memory.services.state_fold import fold_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(tenant_a):
    return agent_get_or_create(tenant=tenant_a, external_id="worker")


def emit(tenant, agent, type_, payload):
    with transaction.atomic():
        return recorder.event_append(tenant=tenant, type=type_, agent=agent, payload=payload)


STEP_REDUCERS = [
    recovery.Reducer("agent.step", "set", "progress.last_step", "step"),
    recovery.Reducer("agent.step", "append", "values", "value"),
    recovery.Reducer("agent.config", "merge", "config", ""),
]


def test_the_fold_follows_the_fold_table(tenant_a, agent):
    session = session_create(tenant=tenant_a, agent_external_id="worker", model_name="gpt-4o")
    messages_append(
        tenant=tenant_a, session=session, items=[MessageInput(role="user", content="hello world")]
    )
    task = task_create(tenant=tenant_a, session=session, title="t1")
    other = task_create(tenant=tenant_a, session=session, title="t2")
    task_update(tenant=tenant_a, task=task, status="succeeded", output="done")
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="r", state={"schema_version": 1})
    fold = recovery.fold_full(tenant=tenant_a, agent=agent)
    assert fold["sessions"] == {"latest": session.public_id, "open": [session.public_id], "created": 1}
    assert fold["messages"]["count"] == 1 and fold["messages"]["last_seq"] == {session.public_id: 1}
    assert fold["messages"]["tokens"] > 0
    assert fold["tasks"] == {"open": [other.public_id], "succeeded": 1, "failed": 0}
    checkpoint = Checkpoint.objects.get(agent=agent)
    assert fold["cognition"]["checkpoint"] == {"id": checkpoint.public_id, "seq": 1}
    assert fold["cognition"]["state_version"] == 1
    last = Event.objects.filter(stream="agent:worker").order_by("-seq").first()
    assert fold["last_event_seq"] == last.seq and fold["event_count"] == last.seq
    assert fold["event_counts"]["message.added"] == 1


def test_declared_reducers_set_merge_and_append_and_bad_events_do_not_stop_the_fold(tenant_a, agent):
    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS)
    emit(tenant_a, agent, "agent.step", {"step": 1, "value": 10})
    emit(tenant_a, agent, "agent.config", {"model": "a", "temp": 0})
    emit(tenant_a, agent, "agent.step", {"step": 2, "value": {"nested": [1]}})
    emit(tenant_a, agent, "agent.config", {"temp": 1})
    emit(tenant_a, agent, "agent.step", {"value": 3})  # no "step": that reducer skips, with a note
    emit(tenant_a, agent, "agent.other", {"step": 99})  # no reducer: counted only
    fold = recovery.fold_full(tenant=tenant_a, agent=agent)
    assert fold["custom"] == {
        "progress": {"last_step": 2},
        "values": [10, {"nested": [1]}, 3],
        "config": {"model": "a", "temp": 1},
    }
    assert fold["event_counts"]["agent.other"] == 1
    assert len(fold["fold_errors"]) == 1 and "step" in fold["fold_errors"][0]["error"]


def test_the_fold_is_deterministic_and_the_stored_fold_equals_a_full_refold(tenant_a, agent):
    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS)
    for step in range(1, 26):
        emit(tenant_a, agent, "agent.step", {"step": step, "value": step * step})
        if step % 10 == 0:
            cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="every 10", step=step)
    incremental, _ = recovery.fold_through(tenant=tenant_a, agent=agent)
    full = recovery.fold_full(tenant=tenant_a, agent=agent)
    assert incremental == full == recovery.fold_full(tenant=tenant_a, agent=agent)
    assert full["custom"]["progress"]["last_step"] == 25
    assert full["custom"]["values"] == [s * s for s in range(1, 26)]
    # folding is pure: the same rows give the same state, and the input is not changed
    rows = list(
        Event.objects.filter(stream="agent:worker").order_by("seq").values_list("seq", "type", "payload")
    )
    before = copy.deepcopy(rows)
    reducers = recovery.reducers_get(tenant=tenant_a, agent=agent)
    first = recovery.fold_events(recovery.fold_initial(), rows, reducers)
    assert recovery.fold_events(recovery.fold_initial(), rows, reducers) == first and rows == before


def test_changing_reducers_refolds_the_whole_stream(tenant_a, agent):
    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS[:1])
    emit(tenant_a, agent, "agent.step", {"step": 1, "value": 5})
    cognition.checkpoint_create(tenant=tenant_a, agent=agent)
    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS)
    fold, _ = recovery.fold_through(tenant=tenant_a, agent=agent)
    assert fold["custom"]["values"] == [5]  # the new append reducer applies to the old event too


def test_recovered_state_has_every_part_and_records_agent_recovered(tenant_a, agent):
    session = session_create(tenant=tenant_a, agent_external_id="worker")
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[MessageInput(role="user", content=f"m{i}") for i in range(30)],
    )
    task = task_create(tenant=tenant_a, session=session, title="build")
    layers.shared_context_write(tenant=tenant_a, task=task, values={"goal": "build it"}, replace=False)
    layers.private_context_put(tenant=tenant_a, task=task, agent=agent, data={"secret": "mine"})
    cognition.checkpoint_create(
        tenant=tenant_a, agent=agent, reason="r", step=7, state={"schema_version": 1, "decision": "go"}
    )
    emit(tenant_a, agent, "agent.step", {"step": 8})
    result = recovery.recovered_state(tenant=tenant_a, agent=agent, caller=agent)
    doc = recovered_state_out(result)
    assert result.warnings == []
    assert doc["checkpoint"]["seq"] == 1 and doc["checkpoint"]["step"] == 7
    assert doc["checkpoint"]["state"]["decision"] == "go"
    assert doc["state"]["version"] == 1
    assert doc["session"]["id"] == session.public_id
    assert [m["content"] for m in doc["session"]["messages"]] == [f"m{i}" for i in range(10, 30)]
    assert doc["tasks"][0]["id"] == task.public_id
    assert doc["tasks"][0]["shared_context"]["goal"] == "build it"
    assert doc["tasks"][0]["private_context"]["data"] == {"secret": "mine"}
    assert [e["type"] for e in doc["events_after_checkpoint"]["items"]] == ["agent.step"]
    assert doc["operational"]["last_event_seq"] == doc["events_after_checkpoint"]["items"][-1]["seq"]
    assert set(doc["parts"]) == {"operational", "checkpoint", "state", "session", "tasks", "events", "inbox"}
    # the document's shape (memory/api/shapes.py renders parts of the aggregates' serializers)
    assert list(doc) == [
        "agent", "generated_at", "operational", "checkpoint", "state", "session", "tasks",
        "events_after_checkpoint", "inbox", "warnings", "parts",
    ]  # fmt: skip
    assert list(doc["session"]) == [
        "id", "status", "user_id", "model", "message_count", "last_accessed_at", "messages"
    ]  # fmt: skip
    assert list(doc["session"]["messages"][0]) == [
        "seq", "role", "content", "turn_id", "tool_call_id", "tool_calls", "event_kind", "created_at"
    ]  # fmt: skip
    assert list(doc["checkpoint"]) == [
        "id", "seq", "reason", "step", "produced_by", "covers_event_seq", "schema_version", "storage",
        "state_bytes", "created_at", "state",
    ]  # fmt: skip
    assert list(doc["events_after_checkpoint"]) == ["after_seq", "truncated", "items"]
    assert list(doc["events_after_checkpoint"]["items"][0]) == ["id", "seq", "type", "payload", "created_at"]
    assert doc["session"]["last_accessed_at"] == session.last_accessed_at.isoformat()
    recovered = Event.objects.filter(stream="agent:worker", type="agent.recovered").get()
    assert recovered.payload["checkpoint_seq"] == 1
    json.dumps(doc)  # one JSON document
    # an operator inspecting (record=False) sees the same content and leaves no event
    inspected = recovered_state_out(
        recovery.recovered_state(tenant=tenant_a, agent=agent, caller=agent, record=False)
    )
    assert inspected["checkpoint"] == doc["checkpoint"] and inspected["tasks"] == doc["tasks"]
    assert Event.objects.filter(stream="agent:worker", type="agent.recovered").count() == 1


def test_a_slow_part_degrades_to_a_warning_and_the_rest_is_returned(tenant_a, agent):
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, state={"schema_version": 1, "decision": "go"})
    result = recovery.recovered_state(
        tenant=tenant_a, agent=agent, caller=agent, timeout_ms=150, slow_parts={"session": 3.0}
    )
    doc = recovered_state_out(result)
    assert doc["session"] is None
    assert [(w["part"], w["code"]) for w in result.warnings] == [("session", "part_timeout")]
    assert doc["parts"]["session"]["ok"] is False
    assert doc["checkpoint"]["state"]["decision"] == "go"  # the other parts are all there
    assert doc["operational"]["cognition"]["checkpoints"] == 1
    assert Event.objects.filter(stream="agent:worker", type="agent.recovered").get().payload["warnings"] == [
        "part_timeout"
    ]


def test_a_slow_fold_is_cut_by_its_deadline(tenant_a, agent):
    with transaction.atomic():
        recorder.events_append(
            tenant=tenant_a,
            agent=agent,
            entries=[("agent.step", {"step": i}) for i in range(3000)],
        )
    result = recovery.recovered_state(tenant=tenant_a, agent=agent, caller=agent, timeout_ms=1)
    assert result.operational is None
    assert ("operational", "part_timeout") in [(w["part"], w["code"]) for w in result.warnings]


def test_another_agent_asking_gets_no_private_context_or_inbox(tenant_a, agent):
    other = agent_get_or_create(tenant=tenant_a, external_id="other")
    task = task_create(tenant=tenant_a, agent_external_id="worker", title="t")
    layers.private_context_put(tenant=tenant_a, task=task, agent=agent, data={"secret": "mine"})
    layers.ipc_send(tenant=tenant_a, task=task, sender=other, recipient=agent, body="psst")
    for caller in (other, None):
        doc = recovered_state_out(recovery.recovered_state(tenant=tenant_a, agent=agent, caller=caller))
        assert "private_context" not in doc["tasks"][0]
        assert doc["inbox"] is None
        assert "mine" not in json.dumps(doc) and "psst" not in json.dumps(doc)
        assert "private_omitted" in [w["code"] for w in doc["warnings"]]


def test_stored_folds_are_kept_on_the_newest_and_full_checkpoints_only(tenant_a, agent):
    from memory.models import CheckpointPolicy

    policy = CheckpointPolicy.for_tenant(tenant_a)
    policy.full_snapshot_every = 3
    policy.save()
    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS)
    for step in range(1, 8):
        emit(tenant_a, agent, "agent.step", {"step": step, "value": step})
        cognition.checkpoint_create(tenant=tenant_a, agent=agent, state={"schema_version": 1}, step=step)
    stored = dict(Checkpoint.objects.filter(agent=agent).exclude(fold_state="").values_list("seq", "storage"))
    assert stored == {1: "full", 4: "full", 7: "full"} or stored == {
        1: "full",
        4: "full",
        6: "delta",
        7: "full",
    }
    assert 7 in stored
    assert recovery.fold_through(tenant=tenant_a, agent=agent)[0] == recovery.fold_full(
        tenant=tenant_a, agent=agent
    )


def test_a_recovery_that_folded_many_events_leaves_its_fold_for_the_next(tenant_a, agent):
    from memory.models import CognitiveState

    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS)
    with transaction.atomic():
        recorder.events_append(
            tenant=tenant_a,
            agent=agent,
            entries=[("agent.step", {"step": i, "value": i}) for i in range(1, 2501)],
        )
    first = recovered_state_out(recovery.recovered_state(tenant=tenant_a, agent=agent, caller=agent))[
        "operational"
    ]
    cached = CognitiveState.objects.get(agent=agent)
    assert cached.fold_seq == first["last_event_seq"] and json.loads(cached.fold_state) == first
    assert cached.version == 0  # a cache on the row, not a state write
    emit(tenant_a, agent, "agent.step", {"step": 2501, "value": 1})
    sha = recovery.reducers_sha256(recovery.reducers_get(tenant=tenant_a, agent=agent))
    assert fold_start(tenant=tenant_a, agent=agent, reducers_sha=sha, through=None)[1] == cached.fold_seq
    expected = recovery.fold_full(tenant=tenant_a, agent=agent)
    second = recovered_state_out(recovery.recovered_state(tenant=tenant_a, agent=agent, caller=agent))[
        "operational"
    ]
    assert second == expected
    assert second["custom"]["progress"] == {"last_step": 2501} and len(second["custom"]["values"]) == 2501
    # another set of reducers does not start from it
    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS[:1])
    sha = recovery.reducers_sha256(recovery.reducers_get(tenant=tenant_a, agent=agent))
    assert fold_start(tenant=tenant_a, agent=agent, reducers_sha=sha, through=None)[1] == 0


def test_a_fold_cut_by_its_deadline_keeps_its_progress_and_the_next_recovery_goes_on(tenant_a, agent):
    from memory.models import CognitiveState

    recovery.reducers_put(tenant=tenant_a, agent=agent, reducers=STEP_REDUCERS)
    with transaction.atomic():
        recorder.events_append(
            tenant=tenant_a,
            agent=agent,
            entries=[("agent.step", {"step": i, "value": i}) for i in range(1, 3501)],
        )
    expected = recovery.fold_full(tenant=tenant_a, agent=agent)
    progress = []
    for _ in range(6):  # a 1 ms deadline: each attempt folds 1,000 more events, then gives up
        doc = recovered_state_out(
            recovery.recovered_state(tenant=tenant_a, agent=agent, caller=agent, timeout_ms=1)
        )
        if doc["operational"] is not None:
            break
        assert ("operational", "part_timeout") in [(w["part"], w["code"]) for w in doc["warnings"]]
        progress.append(CognitiveState.objects.get(agent=agent).fold_seq)
    assert progress == [1000, 2000, 3000]
    assert doc["operational"]["custom"] == expected["custom"]
    assert doc["operational"]["last_event_seq"] == expected["last_event_seq"] + 3  # + the 3 agent.recovered
