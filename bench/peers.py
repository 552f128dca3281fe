# ruff: noqa: UP013  (a bench helper; the TypedDict is built functionally on purpose)
"""The peers of bench/bench_peers.py: langchain-postgres and LangGraph's Postgres checkpointer.

Their databases on the embedded server, their writers (`add_message`, `PostgresSaver.put`, a
one-node graph on a `DeltaChannel`), and what is installed. Needs the `bench` extra.
"""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, TypedDict

import bench_ingest
import psycopg
from psycopg.rows import dict_row

from ctxapp.infra import embedded


def peer_databases(names: list[str]) -> dict[str, str]:
    server = bench_ingest._pg_server  # type: ignore[attr-defined]  # kept alive by prepare()
    return {name: embedded.prepare_database(server.get_uri(), name) for name in names}


def connect(uri: str) -> Any:
    return psycopg.connect(uri, autocommit=True, prepare_threshold=0, row_factory=dict_row)


def lc_history(uri: str) -> tuple[Any, Any]:
    from langchain_postgres import PostgresChatMessageHistory  # lazy: optional-dependency

    conn = connect(uri)
    PostgresChatMessageHistory.create_tables(conn, "chat_history")
    return conn, PostgresChatMessageHistory("chat_history", str(uuid.uuid4()), sync_connection=conn)


def lg_saver(uri: str) -> Any:
    from langgraph.checkpoint.postgres import PostgresSaver  # lazy: optional-dependency

    saver = PostgresSaver(connect(uri))
    saver.setup()
    return saver


def lg_put(
    saver: Any, thread: str, channels: dict[str, Any], parent: dict[str, Any] | None
) -> dict[str, Any]:
    from langgraph.checkpoint.base import empty_checkpoint  # lazy: optional-dependency

    checkpoint = empty_checkpoint()
    version = str(uuid.uuid4().int)
    checkpoint["channel_values"] = channels
    checkpoint["channel_versions"] = dict.fromkeys(channels, version)
    config = parent or {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return dict(
        saver.put(config, checkpoint, {"source": "update", "step": 0}, dict.fromkeys(channels, version))
    )


def delta_graph(saver: Any, reducer: Callable[[Any, Any], Any], typ: type) -> Any | None:
    """A one-node graph whose state is one DeltaChannel (snapshot every 20), or None if unavailable."""
    try:
        from langgraph.channels.delta import DeltaChannel  # lazy: optional-dependency
    except ImportError:
        return None
    from langgraph.graph import END, START, StateGraph  # lazy: optional-dependency

    # Built functionally: this module's annotations are strings (from __future__ import annotations).
    State = TypedDict("State", {"value": Annotated[typ, DeltaChannel(reducer, typ, snapshot_frequency=20)]})  # type: ignore[misc,valid-type]
    graph = StateGraph(State)
    graph.add_node("step", lambda state: None)
    graph.add_edge(START, "step")
    graph.add_edge("step", END)
    return graph.compile(checkpointer=saver)


def merge_dicts(state: dict[str, Any], writes: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(state)
    for write in writes:
        out.update(write)
    return out


def extend_lists(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    return [*state, *(item for write in writes for item in write)]


def has_delta() -> bool:
    try:
        return importlib.util.find_spec("langgraph.channels.delta") is not None
    except ModuleNotFoundError:  # no langgraph at all
        return False


def version_or(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"
