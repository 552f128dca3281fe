"""Cognitive state and checkpoints: versioned writes, delta storage, diff, restore, retention."""

from __future__ import annotations

import copy
import json
import random
from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.api.shapes import state_out
from memory.exceptions import (
    CheckpointCorrupt,
    InvalidState,
    NotFound,
    SchemaVersionUnsupported,
    VersionConflict,
)
from memory.models import Checkpoint, CheckpointPolicy, CognitiveState, Event
from memory.services import cognition
from memory.services.sessions import agent_get_or_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(tenant_a):
    return agent_get_or_create(tenant=tenant_a, external_id="planner")


def state(**overrides):
    doc = {
        "schema_version": 1,
        "context": {"goal": "ship it", "constraints": ["no downtime"]},
        "observation": {"last_tool": "grep", "hits": 3},
        "working_memory": {"notes": ["a", "b"], "score": 0.5},
        "decision": {"next": "deploy"},
        "tool_state": {"grep": {"cwd": "/srv"}},
    }
    doc.update(overrides)
    return doc


def events(tenant, agent, type_=None):
    qs = Event.objects.filter(tenant=tenant, stream=f"agent:{agent.external_id}").order_by("seq")
    return [e for e in qs if type_ is None or e.type == type_]


# --- state ---------------------------------------------------------------------------------------


def test_state_round_trips_exactly_including_key_order_and_number_types(tenant_a, agent):
    doc = state(working_memory={"z": 1, "a": 1.0, "m": True, "ü": "naïve ✓", "big": 2**62, "f": 0.1 + 0.2})
    cognition.state_put(tenant=tenant_a, agent=agent, state=cognition.state_input_parse(doc))
    got = state_out(cognition.state_get(tenant=tenant_a, agent=agent))
    sent = {k: v for k, v in doc.items() if k != "schema_version"}
    for key, value in sent.items():
        assert json.dumps(got[key]) == json.dumps(value)  # same text: key order and 1 vs 1.0 vs true
    assert list(got["working_memory"]) == ["z", "a", "m", "ü", "big", "f"]
    assert got["schema_version"] == 1 and got["version"] == 1
    [event] = events(tenant_a, agent, "state.updated")
    assert event.payload["version"] == 1
    assert "ship it" not in json.dumps(event.payload)  # events name fields, never content


def test_unversioned_legacy_state_is_upgraded_at_the_boundary(tenant_a, agent):
    legacy = {
        "goal": "old goal",
        "constraints": ["c1"],
        "memory": {"k": "v"},
        "tools": {"t": 1},
        "decision": "go",
    }
    view = cognition.state_put(tenant=tenant_a, agent=agent, state=cognition.state_input_parse(legacy))
    assert view.upgraded_from == 0
    got = state_out(cognition.state_get(tenant=tenant_a, agent=agent))
    assert got["schema_version"] == 1
    assert got["context"] == {"goal": "old goal", "constraints": ["c1"]}
    assert got["working_memory"] == {"k": "v"} and got["tool_state"] == {"t": 1} and got["decision"] == "go"
    assert events(tenant_a, agent, "state.updated")[0].payload["upgraded_from"] == 0


def test_newer_schema_is_refused_naming_both_versions_and_nothing_is_stored(tenant_a, agent):
    with pytest.raises(SchemaVersionUnsupported) as info:
        cognition.state_put(
            tenant=tenant_a, agent=agent, state=cognition.state_input_parse(state(schema_version=2))
        )
    assert info.value.details == {"schema_version": 2, "supported_schema_version": 1}
    assert "2" in info.value.message and "1" in info.value.message
    assert not CognitiveState.objects.filter(agent=agent).exists()
    assert events(tenant_a, agent) == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"context": "goal"}, "context"),
        ({"context": {"goal": 3, "constraints": []}}, "context.goal"),
        ({"context": {"goal": "g", "constraints": "x"}}, "context.constraints"),
        ({"working_memory": []}, "working_memory"),
        ({"tool_state": None}, "tool_state"),
        ({"observation": 5}, "observation"),
        ({"decision": [1]}, "decision"),
        ({"schema_version": "1"}, "schema_version"),
        ({"mood": "happy"}, "mood"),
        ({"working_memory": {"x": float("inf")}}, "working_memory.x"),
    ],
)
def test_wrong_types_are_refused_naming_the_field(tenant_a, agent, overrides, field):
    with pytest.raises(InvalidState) as info:
        cognition.state_put(
            tenant=tenant_a, agent=agent, state=cognition.state_input_parse(state(**overrides))
        )
    assert info.value.http_status == 400
    assert info.value.details["field"] == field
    assert not CognitiveState.objects.filter(agent=agent).exists()


def test_expected_version_guards_concurrent_writers(tenant_a, agent):
    cognition.state_put(tenant=tenant_a, agent=agent, state=cognition.state_input_parse(state()))
    with pytest.raises(VersionConflict):
        cognition.state_put(
            tenant=tenant_a,
            agent=agent,
            state=cognition.state_input_parse(state(decision="other")),
            expected_version=0,
        )
    assert cognition.state_get(tenant=tenant_a, agent=agent).document["decision"] == {"next": "deploy"}
    cognition.state_put(
        tenant=tenant_a,
        agent=agent,
        state=cognition.state_input_parse(state(decision="other")),
        expected_version=1,
    )
    assert cognition.state_get(tenant=tenant_a, agent=agent).version == 2


def test_reads_return_copies_never_the_stored_objects(tenant_a, agent):
    cognition.state_put(tenant=tenant_a, agent=agent, state=cognition.state_input_parse(state()))
    first = cognition.state_get(tenant=tenant_a, agent=agent)
    first.document["working_memory"]["notes"].append("mutated")
    state_out(first)["context"]["constraints"].clear()
    checkpoint = cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="r")
    snap = cognition.checkpoint_state(checkpoint=checkpoint)
    snap["working_memory"]["notes"].append("mutated again")
    again = cognition.state_get(tenant=tenant_a, agent=agent)
    assert again.document["working_memory"]["notes"] == ["a", "b"]
    assert again.document["context"]["constraints"] == ["no downtime"]
    assert cognition.checkpoint_state(checkpoint=checkpoint)["working_memory"]["notes"] == ["a", "b"]


# --- checkpoints ---------------------------------------------------------------------------------


def test_checkpoints_have_gapless_seqs_and_cover_their_own_event(tenant_a, agent):
    for step in (10, 20, 30):
        cognition.checkpoint_create(
            tenant=tenant_a,
            agent=agent,
            reason="every 10 steps",
            step=step,
            state=state(working_memory={"s": step}),
        )
    rows = list(Checkpoint.objects.filter(agent=agent).order_by("seq"))
    assert [c.seq for c in rows] == [1, 2, 3]
    assert [c.step for c in rows] == [10, 20, 30]
    created = events(tenant_a, agent, "checkpoint.created")
    assert [e.seq for e in created] == [c.covers_event_seq for c in rows]
    assert [e.payload["checkpoint"] for e in created] == [c.public_id for c in rows]
    assert all(c.public_id.startswith("ckpt_") and len(c.public_id) == 29 for c in rows)
    assert CognitiveState.objects.get(agent=agent).checkpoint_id == rows[-1].pk


def test_checkpoints_store_deltas_with_a_full_snapshot_every_k_and_reconstruct_exactly(tenant_a, agent):
    policy = CheckpointPolicy.for_tenant(tenant_a)
    policy.full_snapshot_every = 4
    policy.save()
    rng = random.Random(7)
    memory = {f"k{i}": "x" * 40 for i in range(100)}
    expected = []
    for step in range(10):
        memory[f"k{rng.randrange(100)}"] = f"step {step}"
        memory.setdefault("log", []).append(step)
        doc = state(working_memory=copy.deepcopy(memory))
        cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="step", step=step, state=doc)
        expected.append({k: v for k, v in doc.items() if k != "schema_version"})
    rows = list(Checkpoint.objects.filter(agent=agent).order_by("seq"))
    assert [c.storage for c in rows] == ["full", "delta", "delta", "delta"] * 2 + ["full", "delta"]
    assert all(len(c.payload) < 600 for c in rows if c.storage == "delta")  # a few ops, not 4 KB states
    for checkpoint, doc in zip(rows, expected, strict=True):
        assert cognition.checkpoint_state(checkpoint=checkpoint) == doc


def test_a_tampered_delta_is_detected_not_silently_returned(tenant_a, agent):
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=state())
    second = cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=state(decision="b"))
    assert second.storage == "delta"
    Checkpoint.objects.filter(pk=second.pk).update(
        payload=json.dumps([{"op": "replace", "path": ["decision"], "value": "tampered"}])
    )
    second.refresh_from_db()
    with pytest.raises(CheckpointCorrupt):
        cognition.checkpoint_state(checkpoint=second)


def test_diff_lists_each_changed_json_path_with_old_and_new(tenant_a, agent):
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=state())
    cognition.checkpoint_create(
        tenant=tenant_a,
        agent=agent,
        state=state(
            context={"goal": "ship it", "constraints": ["no downtime", "by friday"]},
            observation={"last_tool": "ls"},
            working_memory={"notes": ["a", "B"], "score": 1},
        ),
    )
    diff = cognition.checkpoint_diff(tenant=tenant_a, agent=agent, source=1, target="2")
    changes = {c["path"]: c for c in diff.changes}
    assert changes["/context/constraints/1"] == {
        "path": "/context/constraints/1",
        "segments": ["context", "constraints", 1],
        "change": "added",
        "new": "by friday",
    }
    assert (
        changes["/observation/last_tool"]["old"] == "grep"
        and changes["/observation/last_tool"]["new"] == "ls"
    )
    assert changes["/observation/hits"] == {
        "path": "/observation/hits",
        "segments": ["observation", "hits"],
        "change": "removed",
        "old": 3,
    }
    assert changes["/working_memory/notes/1"]["change"] == "changed"
    # 0.5 → 1 is a change, and so would be 1 → 1.0 or 1 → true: JSON types are compared too
    assert changes["/working_memory/score"] == {
        "path": "/working_memory/score",
        "segments": ["working_memory", "score"],
        "change": "changed",
        "old": 0.5,
        "new": 1,
    }
    assert len(diff.changes) == 5
    assert cognition.checkpoint_diff(tenant=tenant_a, agent=agent, source=2, target=2).changes == []
    with pytest.raises(NotFound):
        cognition.checkpoint_diff(tenant=tenant_a, agent=agent, source=1, target=9)


def test_diff_tells_one_from_true_and_from_one_point_zero():
    assert [o["op"] for o in cognition.json_diff({"a": 1}, {"a": True})] == ["replace"]
    assert [o["op"] for o in cognition.json_diff({"a": 1}, {"a": 1.0})] == ["replace"]
    assert cognition.json_diff({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}) == []


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=4), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=json_values, new=json_values)
def test_applying_the_diff_always_yields_the_new_document(old, new):
    ops = cognition.json_diff(old, new, with_old=False)
    result = cognition.json_patch_apply(json.loads(json.dumps(old)), json.loads(json.dumps(ops)))
    assert cognition.json_same(result, new)


def test_restore_writes_a_new_state_and_checkpoint_forward_and_keeps_history(tenant_a, agent):
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="good", state=state(decision="good"))
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="bad", state=state(decision="bad"))
    view, checkpoint = cognition.state_restore(tenant=tenant_a, agent=agent, ref=1)
    assert view.document["decision"] == "good"
    assert view.version == 3
    assert checkpoint.seq == 3 and checkpoint.reason == "restored from #1"
    assert view.checkpoint == {"id": checkpoint.public_id, "seq": 3}
    assert [
        cognition.checkpoint_state(checkpoint=c)["decision"] for c in Checkpoint.objects.order_by("seq")
    ] == [
        "good",
        "bad",
        "good",
    ]
    [restored] = events(tenant_a, agent, "state.restored")
    assert restored.payload["from_seq"] == 1 and restored.payload["version"] == 3
    with pytest.raises(NotFound):
        cognition.state_restore(tenant=tenant_a, agent=agent, ref="ckpt_000000000000000000000000")


# --- retention -----------------------------------------------------------------------------------


def _make_chain(tenant, agent, count, *, full_every, start, spacing):
    policy = CheckpointPolicy.for_tenant(tenant)
    policy.full_snapshot_every = full_every
    policy.save()
    expected = {}
    memory = {f"k{i}": i for i in range(30)}
    for seq in range(1, count + 1):
        memory[f"k{seq % 30}"] = f"v{seq}"
        memory["seq"] = seq
        doc = state(working_memory=dict(memory))
        checkpoint = cognition.checkpoint_create(tenant=tenant, agent=agent, reason="auto", state=doc)
        Checkpoint.objects.filter(pk=checkpoint.pk).update(created_at=start + spacing * (seq - 1))
        expected[seq] = {k: v for k, v in doc.items() if k != "schema_version"}
    return expected


def test_keep_policy_keeps_last_n_one_per_hour_and_one_per_day():
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    policy = CheckpointPolicy(keep_last=2, keep_hourly_hours=3, keep_daily_days=2)
    rows = [(i + 1, now - timedelta(minutes=20 * (30 - i))) for i in range(30)]  # every 20 min over 10 h
    keep = cognition.checkpoints_to_keep(rows, policy=policy, now=now, pinned={1})
    hours_back = {seq for seq, created in rows if created >= now - timedelta(hours=3)}
    assert {29, 30} <= keep and 1 in keep  # last two and the pinned one
    newest_per_hour = {}
    for seq, created in rows:
        if seq in hours_back:
            newest_per_hour[created.replace(minute=0)] = seq
    assert set(newest_per_hour.values()) <= keep
    assert len(keep) < len(rows)


def test_pruning_rebases_deltas_and_every_kept_checkpoint_still_reconstructs(tenant_a, agent):
    start = timezone.now() - timedelta(days=5)
    expected = _make_chain(tenant_a, agent, 60, full_every=7, start=start, spacing=timedelta(hours=2))
    policy = CheckpointPolicy.for_tenant(tenant_a)
    policy.keep_last, policy.keep_hourly_hours, policy.keep_daily_days = 5, 6, 3
    policy.save()
    pruned = cognition.checkpoints_prune(tenant=tenant_a, agent=agent)
    kept = list(Checkpoint.objects.filter(agent=agent).order_by("seq"))
    assert pruned and len(kept) + len(pruned) == 60
    assert {c.seq for c in kept} >= set(range(56, 61))
    assert any(c.seq not in range(56, 61) for c in kept)  # hourly/daily survivors from older days
    for checkpoint in kept:
        assert cognition.checkpoint_state(checkpoint=checkpoint) == expected[checkpoint.seq]
        if checkpoint.storage == "delta":
            assert checkpoint.base_seq in {c.seq for c in kept}  # never points at a pruned one
    assert max(c.delta_depth for c in kept) < 7
    [evicted] = events(tenant_a, agent, "retention.evicted")
    assert evicted.payload["kind"] == "checkpoint" and evicted.payload["seqs"] == pruned
    assert cognition.checkpoints_prune(tenant=tenant_a, agent=agent) == []  # idempotent
    # new checkpoints keep chaining onto the re-based history
    nxt = cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=state(decision="after prune"))
    assert nxt.seq == 61
    assert cognition.checkpoint_state(checkpoint=nxt)["decision"] == "after prune"


def test_pruning_never_removes_the_checkpoint_the_state_points_at(tenant_a, agent):
    start = timezone.now() - timedelta(days=40)
    _make_chain(tenant_a, agent, 12, full_every=5, start=start, spacing=timedelta(days=3))
    cognition.state_restore(tenant=tenant_a, agent=agent, ref=2)  # the pointer moves to the new #13
    CognitiveState.objects.filter(agent=agent).update(checkpoint=Checkpoint.objects.get(agent=agent, seq=3))
    policy = CheckpointPolicy.for_tenant(tenant_a)
    policy.keep_last, policy.keep_hourly_hours, policy.keep_daily_days = 1, 0, 0
    policy.save()
    cognition.checkpoints_prune(tenant=tenant_a, agent=agent)
    assert sorted(Checkpoint.objects.filter(agent=agent).values_list("seq", flat=True)) == [3, 13]
    for checkpoint in Checkpoint.objects.filter(agent=agent):
        cognition.checkpoint_state(checkpoint=checkpoint)  # verified against the recorded hash


# --- the retention jobs ----------------------------------------------------------------------------


def _over_keep_last(tenant, agent, count=6, keep_last=3):
    policy = CheckpointPolicy.for_tenant(tenant)
    policy.keep_last, policy.keep_hourly_hours, policy.keep_daily_days, policy.full_snapshot_every = (
        keep_last,
        0,
        0,
        4,
    )
    policy.save()
    for step in range(count):
        cognition.checkpoint_create(tenant=tenant, agent=agent, state=state(working_memory={"step": step}))


def test_the_prune_job_finds_agents_over_their_keep_last_and_prunes_them(tenant_a, tenant_b, agent):
    from memory.tasks.cognition import checkpoints_prune_agent

    _over_keep_last(tenant_a, agent)
    bob_agent = agent_get_or_create(tenant=tenant_b, external_id="planner")
    _over_keep_last(tenant_b, bob_agent, count=2)  # under its tenant's keep_last: left alone
    assert cognition.agents_with_prunable_checkpoints() == [agent.pk]
    assert checkpoints_prune_agent(agent.pk) == 3  # the task body, run in-process
    assert sorted(Checkpoint.objects.filter(agent=agent).values_list("seq", flat=True)) == [4, 5, 6]
    assert Checkpoint.objects.filter(agent=bob_agent).count() == 2
    assert cognition.agents_with_prunable_checkpoints() == []
    assert checkpoints_prune_agent(999_999) == 0  # a deleted agent: nothing to do


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_the_hourly_prune_runs_on_a_real_worker(tenant_a, celery_worker):
    import time

    from memory.tasks.cognition import checkpoints_prune_all

    agent = agent_get_or_create(tenant=tenant_a, external_id="planner")
    _over_keep_last(tenant_a, agent, count=8)
    assert checkpoints_prune_all() == 1  # queues one job per agent over its keep_last
    deadline = time.monotonic() + 60
    while Checkpoint.objects.filter(agent=agent).count() > 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(Checkpoint.objects.filter(agent=agent).values_list("seq", flat=True)) == [6, 7, 8]
    for checkpoint in Checkpoint.objects.filter(agent=agent):
        cognition.checkpoint_state(checkpoint=checkpoint)
    assert Event.objects.filter(type="retention.evicted", stream="agent:planner").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_checkpoints_get_gapless_unique_seqs_and_all_reconstruct(tenant_a):
    import threading

    from django.db import connection

    agent = agent_get_or_create(tenant=tenant_a, external_id="busy")
    errors = []

    def writer(worker: int) -> None:
        try:
            for step in range(5):
                cognition.checkpoint_create(
                    tenant=tenant_a,
                    agent=agent,
                    reason=f"w{worker}",
                    step=step,
                    state=state(working_memory={"worker": worker, "step": step}),
                )
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = list(Checkpoint.objects.filter(agent=agent).order_by("seq"))
    assert [c.seq for c in rows] == list(range(1, 21))
    created = Event.objects.filter(stream="agent:busy", type="checkpoint.created").order_by("seq")
    assert [e.payload["seq"] for e in created] == list(range(1, 21))  # event order = checkpoint order
    for checkpoint in rows:
        doc = cognition.checkpoint_state(checkpoint=checkpoint)
        assert f"w{doc['working_memory']['worker']}" == checkpoint.reason
