"""CtxappSaver side by side with LangGraph's own InMemorySaver under the three durability modes
("sync", "async" — LangGraph's default — and "exit"): the same graph, the same calls, the same
task runs, state, pending writes and interrupts, against a live server."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from ctxapp.client import Client
from ctxapp.integrations.langgraph import CtxappSaver

MODES = ["sync", "async", "exit"]
DEADLINE = 20.0


class Trip(TypedDict):
    done: Annotated[list[str], operator.add]


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _compiled(saver: BaseCheckpointSaver, nodes: list[Any], edges: list[tuple[str, str]]) -> Any:
    builder = StateGraph(Trip)
    for node in nodes:
        builder.add_node(node.__name__, node)
    for source, target in edges:
        builder.add_edge(source, target)
    return builder.compile(checkpointer=saver)


def _side_by_side(run: Callable[..., Any], server: str, key: str, durability: str) -> tuple[Any, Any]:
    """(what InMemorySaver gives, what CtxappSaver gives): `run(saver, fresh_saver, durability)`,
    the fresh saver standing for a new process (for InMemorySaver, the same store)."""
    memory = InMemorySaver()
    expected = run(memory, memory, durability)
    ours = run(CtxappSaver(Client(server, key)), CtxappSaver(Client(server, key)), durability)
    return expected, ours


def _booking(saver: BaseCheckpointSaver, config: Any, durability: str, calls: dict[str, int]) -> Any:
    """book_hotel and book_flight in parallel; book_flight fails once, after book_hotel's writes
    are stored (under "exit" nothing is stored before the run ends)."""
    hotel_done = threading.Event()

    def book_hotel(state: Trip) -> dict[str, Any]:
        calls["book_hotel"] = calls.get("book_hotel", 0) + 1
        hotel_done.set()
        return {"done": ["hotel"]}

    def hotel_write_stored() -> bool:
        found = saver.get_tuple(config)
        return found is not None and any(w[2] == ["hotel"] for w in found.pending_writes or [])

    def book_flight(state: Trip) -> dict[str, Any]:
        calls["book_flight"] = calls.get("book_flight", 0) + 1
        if calls["book_flight"] == 1:
            assert hotel_done.wait(DEADLINE)
            if durability != "exit":
                _wait_for(hotel_write_stored)
            raise RuntimeError("the airline API timed out")
        return {"done": ["flight"]}

    return _compiled(
        saver,
        [book_hotel, book_flight],
        [(START, "book_hotel"), (START, "book_flight"), ("book_hotel", END), ("book_flight", END)],
    )


def _failed_then_resumed(saver: BaseCheckpointSaver, fresh: BaseCheckpointSaver, durability: str) -> Any:
    config = {"configurable": {"thread_id": f"booking {durability}"}}
    calls: dict[str, int] = {}
    with pytest.raises(RuntimeError, match="timed out"):
        _booking(saver, config, durability, calls).invoke({"done": []}, config, durability=durability)
    # What a new process sees: a new graph over a fresh saver (for InMemorySaver, the same store).
    graph = _booking(fresh, config, durability, calls)
    before = graph.get_state(config)
    result = graph.invoke(None, config, durability=durability)
    return {
        "calls": calls,
        "next_before_resume": before.next,
        "errors_before_resume": sorted(str(t.error) for t in before.tasks if t.error),
        "result": sorted(result["done"]),
        "after": sorted(graph.get_state(config).values["done"]),
    }


@pytest.mark.parametrize("durability", MODES)
def test_a_task_that_finished_is_not_run_again_on_resume(
    server: str, alice_key: str, durability: str
) -> None:
    expected, ours = _side_by_side(_failed_then_resumed, server, alice_key, durability)
    assert expected["calls"] == {"book_hotel": 1, "book_flight": 2}
    assert ours == expected


def _review(saver: BaseCheckpointSaver, published: list[str]) -> Any:
    """draft → review (interrupt(): a person approves) → publish."""

    def draft(state: Trip) -> dict[str, Any]:
        return {"done": ["drafted"]}

    def review(state: Trip) -> dict[str, Any]:
        answer = interrupt({"question": "Publish this draft?"})
        return {"done": [f"reviewed: {answer}"]}

    def publish(state: Trip) -> dict[str, Any]:
        published.append("published")
        return {"done": ["published"]}

    return _compiled(
        saver,
        [draft, review, publish],
        [(START, "draft"), ("draft", "review"), ("review", "publish"), ("publish", END)],
    )


def _interrupted_then_approved(
    saver: BaseCheckpointSaver, fresh: BaseCheckpointSaver, durability: str
) -> Any:
    config = {"configurable": {"thread_id": f"review {durability}"}}
    published: list[str] = []
    first = _review(saver, published).invoke({"done": []}, config, durability=durability)
    graph = _review(fresh, published)
    pending = graph.get_state(config)
    result = graph.invoke(Command(resume="yes"), config, durability=durability)
    return {
        "first": first.get("__interrupt__", [None])[0].value if "__interrupt__" in first else None,
        "next": pending.next,
        "interrupts": [i.value for i in pending.interrupts],
        "values": pending.values,
        "result": result["done"],
        "published": published,
    }


@pytest.mark.parametrize("durability", MODES)
def test_a_pending_interrupt_shows_from_a_fresh_saver(server: str, alice_key: str, durability: str) -> None:
    expected, ours = _side_by_side(_interrupted_then_approved, server, alice_key, durability)
    assert expected["interrupts"] == [{"question": "Publish this draft?"}]
    assert expected["result"] == ["drafted", "reviewed: yes", "published"]
    assert ours == expected
