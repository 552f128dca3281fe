"""CtxappSaver: LangGraph's own conformance suite, the sync API, and real compiled graphs that are
interrupted and resume from ctxapp, all against a live server."""

from __future__ import annotations

import asyncio
import json
import operator
import os
from datetime import UTC, datetime
from typing import Annotated, Any, TypedDict

import pytest
from django.contrib.auth import get_user_model
from django.test import Client as DjangoClient
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, BASE_CAPABILITIES
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from ctxapp.client import AsyncClient, Client
from ctxapp.integrations.langgraph import CtxappSaver
from memory.models import Agent, AgentBlob, Checkpoint, Event, Membership, MembershipRole, Tenant

WHEN = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def _checkpoint(cid: str | None = None, **values: Any) -> Any:
    checkpoint = empty_checkpoint()
    if cid:
        checkpoint["id"] = cid
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = {key: 1 for key in values}
    return checkpoint


def test_langgraphs_conformance_suite_passes_every_capability(server: str, alice_key: str) -> None:
    async def run() -> Any:
        @checkpointer_test(name="CtxappSaver")
        async def factory() -> Any:
            async with AsyncClient(server, alice_key) as client:
                yield CtxappSaver(async_client=client)

        return await validate(factory)

    report = asyncio.run(run())
    assert {capability.value for capability in BASE_CAPABILITIES} < {c.value for c in ALL_CAPABILITIES}
    for capability in ALL_CAPABILITIES:
        result = report.results[capability.value]
        assert result.detected, capability
        assert result.tests_passed > 0 and result.tests_skipped == 0, capability
        assert result.passed is True, (capability, result.failures)
    assert report.passed_all_base() and report.passed_all()
    # The suite leaves its threads behind: found by list(None), delete_thread removes every one.
    saver = CtxappSaver(Client(server, alice_key))
    threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
    assert len(threads) > 10
    for thread in threads:
        saver.delete_thread(thread)
    assert list(saver.list(None)) == []
    assert list(Agent.objects.filter(tenant__slug="alice").values_list("external_id", flat=True)) == []


def test_put_get_list_and_writes_through_the_sync_client(server: str, alice_key: str) -> None:
    saver = CtxappSaver(Client(server, alice_key))
    thread = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
    first = saver.put(thread, _checkpoint(messages=["hi"], n=1), {"source": "input", "step": -1}, {})
    second = saver.put(
        first,
        _checkpoint(messages=["hi", HumanMessage("ok", id="m1")], n=2, at=WHEN),
        {"source": "loop", "step": 0},
        {},
    )
    child_cfg = {"configurable": {"thread_id": "t-1", "checkpoint_ns": "child:abc"}}
    child = saver.put(child_cfg, _checkpoint(inner=True), {"source": "loop", "step": 0, "parents": {}}, {})
    saver.put_writes(second, [("messages", "w1"), ("n", 3)], task_id="task-1", task_path="~0")
    saver.put_writes(second, [("messages", "again")], task_id="task-1")  # same (task, idx 0): kept once
    saver.put_writes(second, [("__error__", "boom")], task_id="task-2")
    saver.put_writes(second, [("__error__", "boom 2")], task_id="task-2")  # special: replaced

    latest = saver.get_tuple({"configurable": {"thread_id": "t-1"}})
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == second["configurable"]["checkpoint_id"]
    # Non-JSON values (a message, a datetime) go through LangGraph's serde and come back typed.
    assert latest.checkpoint["channel_values"] == {
        "messages": ["hi", HumanMessage("ok", id="m1")],
        "n": 2,
        "at": WHEN,
    }
    assert latest.checkpoint["channel_versions"] == {"messages": 1, "n": 1, "at": 1}
    assert latest.parent_config == {
        "configurable": {
            "thread_id": "t-1",
            "checkpoint_ns": "",
            "checkpoint_id": first["configurable"]["checkpoint_id"],
        }
    }
    assert sorted(latest.pending_writes or []) == sorted(
        [("task-1", "messages", "w1"), ("task-1", "n", 3), ("task-2", "__error__", "boom 2")]
    )
    older = saver.get_tuple(first)
    assert older is not None and older.checkpoint["channel_values"]["n"] == 1 and older.parent_config is None
    inner = saver.get_tuple(child)
    assert inner is not None and inner.checkpoint["channel_values"] == {"inner": True}

    everything = list(saver.list({"configurable": {"thread_id": "t-1"}}))
    assert len(everything) == 3
    root = list(saver.list({"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}))
    assert [t.checkpoint["channel_values"]["n"] for t in root] == [2, 1]
    assert [t.metadata["source"] for t in saver.list(thread, filter={"source": "input"})] == ["input"]
    assert len(list(saver.list(thread, before=second))) == 1
    assert len(list(saver.list({"configurable": {"thread_id": "t-1"}}, limit=1))) == 1
    assert saver.get_tuple({"configurable": {"thread_id": "nobody"}}) is None
    assert not Agent.objects.filter(external_id="langgraph-nobody").exists()

    # Stored as ctxapp checkpoints of the thread's agent, the checkpoint id as their producer.
    stored = list(Checkpoint.objects.filter(agent__external_id="langgraph-t-1").order_by("seq"))
    assert [c.produced_by for c in stored[:2]] == [
        first["configurable"]["checkpoint_id"],
        second["configurable"]["checkpoint_id"],
    ]
    assert (
        Event.objects.filter(agent__external_id="langgraph-t-1", type="agent.langgraph.writes").count() == 4
    )


def test_another_tenant_does_not_see_the_thread(server: str, alice_key: str, bob_key: str) -> None:
    alice = CtxappSaver(Client(server, alice_key))
    bob = CtxappSaver(Client(server, bob_key))
    config = {"configurable": {"thread_id": "shared-name", "checkpoint_ns": ""}}
    alice.put(config, _checkpoint(secret="alice's"), {"source": "input", "step": -1}, {})
    assert bob.get_tuple(config) is None
    assert list(bob.list(config)) == []
    bob.put(config, _checkpoint(secret="bob's"), {"source": "input", "step": -1}, {})
    found = alice.get_tuple(config)
    assert found is not None and found.checkpoint["channel_values"] == {"secret": "alice's"}


def test_a_thread_id_is_kept_as_given(server: str, alice_key: str) -> None:
    saver = CtxappSaver(Client(server, alice_key))
    odd = "user/42 #ünïcode? 100%"
    config = {"configurable": {"thread_id": odd, "checkpoint_ns": ""}}
    saver.put(config, _checkpoint(x=1), {"source": "input", "step": -1}, {})
    found = saver.get_tuple(config)
    assert found is not None
    assert found.config["configurable"]["thread_id"] == odd
    # The agent's id is the thread id as given; only '/' and '%' (which an agent id cannot hold
    # or which would be ambiguous) are percent-encoded.
    assert list(Agent.objects.values_list("external_id", flat=True)) == [
        "langgraph-user%2F42 #ünïcode? 100%25"
    ]
    plain = {"configurable": {"thread_id": "ticket 42", "checkpoint_ns": ""}}
    saver.put(plain, _checkpoint(x=2), {"source": "input", "step": -1}, {})
    assert Agent.objects.filter(external_id="langgraph-ticket 42").exists()


def test_list_without_a_thread_lists_every_thread_and_delete_thread_removes_one(
    server: str, alice_key: str
) -> None:
    saver = CtxappSaver(Client(server, alice_key))
    for thread, n in [("a", 1), ("b", 2), ("c", 3)]:
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        stored = saver.put(config, _checkpoint(n=n), {"source": "input", "step": -1, "n": n}, {})
        saver.put_writes(stored, [("n", n * 10)], task_id=f"task-{thread}")
    everything = list(saver.list(None))
    assert sorted(t.config["configurable"]["thread_id"] for t in everything) == ["a", "b", "c"]
    assert sorted(t.pending_writes[0][2] for t in everything if t.pending_writes) == [10, 20, 30]
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None, filter={"n": 2})] == ["b"]
    assert len(list(saver.list(None, limit=2))) == 2

    saver.delete_thread("b")
    assert saver.get_tuple({"configurable": {"thread_id": "b"}}) is None
    assert sorted(t.config["configurable"]["thread_id"] for t in saver.list(None)) == ["a", "c"]
    assert not Agent.objects.filter(external_id="langgraph-b").exists()
    assert not Event.objects.filter(stream="agent:langgraph-b").exists()
    saver.delete_thread("never-written")  # a thread that does not exist: nothing to do


def test_a_new_thread_costs_no_failing_request(server: str, alice_key: str, caplog: Any) -> None:
    caplog.set_level("INFO", logger="httpx")
    saver = CtxappSaver(Client(server, alice_key))
    config = {"configurable": {"thread_id": "fresh"}}
    graph_calls: dict[str, int] = {}
    _graph(saver, graph_calls).invoke({"steps": [], "brief": "b"}, config)
    answers = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert answers and all(" 20" in answer for answer in answers), [a for a in answers if " 20" not in a]


# --- real graphs -------------------------------------------------------------------------------


class Trip(TypedDict):
    steps: Annotated[list[str], operator.add]
    brief: str


BRIEF = "Lyon, two adults, window seats. " * 200  # ~6 KB that no step changes


def _graph(saver: CtxappSaver, calls: dict[str, int], *, fail_once: bool = False) -> Any:
    def plan(state: Trip) -> dict[str, Any]:
        calls["plan"] = calls.get("plan", 0) + 1
        return {"steps": ["planned"]}

    def book(state: Trip) -> dict[str, Any]:
        calls["book"] = calls.get("book", 0) + 1
        if fail_once and calls["book"] == 1:
            raise RuntimeError("the booking API timed out")
        return {"steps": ["booked"]}

    builder = StateGraph(Trip)
    builder.add_node("plan", plan)
    builder.add_node("book", book)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "book")
    builder.add_edge("book", END)
    return builder.compile(checkpointer=saver, interrupt_before=[] if fail_once else ["book"])


def test_a_compiled_graph_interrupted_before_a_node_resumes_from_ctxapp(server: str, alice_key: str) -> None:
    config = {"configurable": {"thread_id": "trip-1"}}
    calls: dict[str, int] = {}
    first = _graph(CtxappSaver(Client(server, alice_key)), calls)
    paused = first.invoke({"steps": [], "brief": BRIEF}, config)
    assert paused["steps"] == ["planned"]
    assert first.get_state(config).next == ("book",)

    # A new process: a fresh saver and client, nothing in memory. It resumes where the first stopped.
    resumed_graph = _graph(CtxappSaver(Client(server, alice_key)), calls)
    assert resumed_graph.get_state(config).next == ("book",)
    done = resumed_graph.invoke(None, config)
    assert done["steps"] == ["planned", "booked"]
    assert calls == {"plan": 1, "book": 1}
    history = list(resumed_graph.get_state_history(config))
    assert len(history) >= 4
    assert history[0].next == ()
    assert history[0].values["brief"] == BRIEF
    # ctxapp stored the steps as deltas of the unchanged ~6 KB brief, not as full copies.
    stored = list(Checkpoint.objects.filter(agent__external_id="langgraph-trip-1").order_by("seq"))
    assert len(stored) == len(history)
    # (the first checkpoint holds only the input; the second is the first with the brief)
    assert [c.storage for c in stored[2:]] == ["delta"] * (len(stored) - 2)
    assert all(len(c.payload) < len(BRIEF) / 2 for c in stored[2:])


def test_a_graph_that_failed_resumes_without_rerunning_what_succeeded(server: str, alice_key: str) -> None:
    async def run() -> tuple[Any, dict[str, int]]:
        config = {"configurable": {"thread_id": "trip-2"}}
        calls: dict[str, int] = {}
        async with AsyncClient(server, alice_key) as client:
            graph = _graph(CtxappSaver(async_client=client), calls, fail_once=True)
            with pytest.raises(RuntimeError, match="timed out"):
                await graph.ainvoke({"steps": [], "brief": BRIEF}, config)
            state = await graph.aget_state(config)
            assert state.next == ("book",)
            result = await graph.ainvoke(None, config)
        return result, calls

    result, calls = asyncio.run(run())
    assert result["steps"] == ["planned", "booked"]
    assert calls == {"plan": 1, "book": 2}  # plan ran once; only the failed node ran again


def test_a_subgraph_interrupted_inside_resumes_with_its_namespace(server: str, alice_key: str) -> None:
    calls: dict[str, int] = {}

    def check(state: Trip) -> dict[str, Any]:
        calls["check"] = calls.get("check", 0) + 1
        return {"steps": ["checked"]}

    def pay(state: Trip) -> dict[str, Any]:
        calls["pay"] = calls.get("pay", 0) + 1
        return {"steps": ["paid"]}

    inner = StateGraph(Trip)
    inner.add_node("check", check)
    inner.add_node("pay", pay)
    inner.add_edge(START, "check")
    inner.add_edge("check", "pay")
    inner.add_edge("pay", END)

    def build(saver: CtxappSaver) -> Any:
        outer = StateGraph(Trip)
        outer.add_node("payment", inner.compile(interrupt_before=["pay"]))
        outer.add_edge(START, "payment")
        outer.add_edge("payment", END)
        return outer.compile(checkpointer=saver)

    config = {"configurable": {"thread_id": "trip-3"}}
    build(CtxappSaver(Client(server, alice_key))).invoke({"steps": [], "brief": "b"}, config)
    resumed = build(CtxappSaver(Client(server, alice_key)))
    state = resumed.get_state(config, subgraphs=True)
    assert state.next == ("payment",)
    assert state.tasks[0].state.next == ("pay",)  # the subgraph's own checkpoint, from its namespace
    done = resumed.invoke(None, config)
    assert done["steps"] == ["checked", "paid"]
    assert calls == {"check": 1, "pay": 1}
    reasons = set(
        Checkpoint.objects.filter(agent__external_id="langgraph-trip-3").values_list("reason", flat=True)
    )
    assert "langgraph" in reasons
    assert any(reason.startswith("langgraph payment:") for reason in reasons)


def test_the_dashboard_shows_stored_values_decoded(server: str, alice_key: str) -> None:
    saver = CtxappSaver(Client(server, alice_key))
    config = {"configurable": {"thread_id": "dash", "checkpoint_ns": ""}}
    values = {"messages": [HumanMessage("Where is my parcel?", id="m1")], "at": WHEN, "n": 1}
    saver.put(config, _checkpoint(**values), {"source": "input", "step": -1}, {})
    packed = Checkpoint.objects.get(agent__external_id="langgraph-dash")
    assert '"b64"' in packed.payload  # stored through LangGraph's serde, base64

    user = get_user_model().objects.create_user(username="alice", password="correct horse battery")
    Membership.objects.create(
        user=user, tenant=Tenant.objects.get(slug="alice"), role=MembershipRole.OPERATOR
    )
    web = DjangoClient()
    web.force_login(user)
    page = web.get(f"/agents/langgraph-dash/checkpoints/{packed.seq}")
    assert page.status_code == 200
    shown = page.content.decode()
    assert "Where is my parcel?" in shown and "HumanMessage" in shown
    assert "2026-12-01T09:30:00+00:00" in shown
    assert '"b64"' not in shown


def test_a_thread_deleted_by_another_saver_can_be_written_again(server: str, alice_key: str) -> None:
    first, other = CtxappSaver(Client(server, alice_key)), CtxappSaver(Client(server, alice_key))
    config = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    first.put(config, _checkpoint(n=1), {"source": "input", "step": -1}, {})
    other.delete_thread("shared")
    assert first.get_tuple(config) is None
    first.put(config, _checkpoint(n=2), {"source": "input", "step": -1}, {})
    found = other.get_tuple(config)
    assert found is not None and found.checkpoint["channel_values"] == {"n": 2}


def test_a_value_of_16_mib_is_kept_as_in_memory_saver_keeps_it(server: str, alice_key: str) -> None:
    """A checkpoint value and a pending write far over a state's and an event's limits: stored as
    blobs of the thread, the checkpoint and the writes event carry their digest."""
    big = os.urandom(16 * 1024 * 1024)  # incompressible, through LangGraph's serde
    notes = "n" * (300 * 1024)  # plain JSON, over an event payload's 256 KiB
    saver, reference = CtxappSaver(Client(server, alice_key, timeout=300)), InMemorySaver()
    config = {"configurable": {"thread_id": "big", "checkpoint_ns": ""}}
    one = _checkpoint("1", big=big, n=1)
    two = {**_checkpoint("2", big=big, notes=notes, n=2), "channel_versions": {"big": 1, "notes": 1, "n": 2}}
    for each in (saver, reference):  # InMemorySaver keeps the values of the versions said new
        first = each.put(config, one, {"source": "input", "step": -1}, one["channel_versions"])
        each.put_writes(first, [("big", big), ("notes", notes), ("n", 2)], task_id="task-1")
        # The next step: the large value unchanged, and a new one.
        second = each.put(first, two, {"source": "loop", "step": 0}, {"notes": 1, "n": 2})

    for cfg in (first, second):
        mine, theirs = saver.get_tuple(cfg), reference.get_tuple(cfg)
        assert mine is not None and theirs is not None
        assert mine.checkpoint["channel_values"] == theirs.checkpoint["channel_values"]
        assert sorted(mine.pending_writes or []) == sorted(theirs.pending_writes or [])
        assert mine.metadata == theirs.metadata
    assert [t.checkpoint["id"] for t in saver.list(config)] == ["2", "1"]

    # The event log and the checkpoints carry references; each value's bytes are stored once.
    writes = Event.objects.get(agent__external_id="langgraph-big", type="agent.langgraph.writes")
    assert len(json.dumps(writes.payload)) < 4096
    # A checkpoint keeps a value up to 1 MiB inline (readable, stored as a delta), not 16 MiB.
    sizes = [len(c.payload) for c in Checkpoint.objects.filter(agent__external_id="langgraph-big")]
    assert len(sizes) == 2 and max(sizes) < 1024 * 1024
    blobs = AgentBlob.objects.filter(agent__external_id="langgraph-big")
    kept = sorted(b.size for b in blobs)  # as LangGraph's serde gives them: the bytes, msgpack for the text
    assert len(kept) == 2 and kept[0] >= len(notes) and kept[1] == len(big)
    saver.delete_thread("big")
    assert not AgentBlob.objects.exists()


def test_a_graph_whose_state_grows_past_an_events_limit_runs_and_resumes(server: str, alice_key: str) -> None:
    class Doc(TypedDict):
        pages: Annotated[list[str], operator.add]

    def write(state: Doc) -> dict[str, Any]:
        return {"pages": [f"page {len(state['pages'])} " + "x" * (400 * 1024)]}

    def build(saver: Any) -> Any:
        builder = StateGraph(Doc)
        builder.add_node("write", write)
        builder.add_edge(START, "write")
        builder.add_edge("write", END)
        return builder.compile(checkpointer=saver)

    config = {"configurable": {"thread_id": "doc-1"}}
    reference = build(InMemorySaver())
    graph = build(CtxappSaver(Client(server, alice_key, timeout=120)))
    for _ in range(3):  # each run adds a 400 KiB page: 1.2 MiB of state at the end
        assert graph.invoke({"pages": []}, config) == reference.invoke({"pages": []}, config)
    fresh = build(CtxappSaver(Client(server, alice_key, timeout=120)))  # another process, nothing cached
    assert fresh.get_state(config).values == reference.get_state(config).values
    assert len(fresh.get_state(config).values["pages"]) == 3
