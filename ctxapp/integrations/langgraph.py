"""A LangGraph checkpointer (`BaseCheckpointSaver`, sync and async) backed by ctxapp checkpoints.

    pip install 'ctxapp[langgraph]'

    from ctxapp.client import Client
    from ctxapp.integrations.langgraph import CtxappSaver

    graph = builder.compile(checkpointer=CtxappSaver(Client(url, key)))
    graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})

Mapping (docs/integrations.md, "LangChain and LangGraph"):

- a LangGraph thread is a ctxapp agent, `<agent_prefix><thread_id>`, the thread id as given but
  for '/' and '%' (percent-encoded), created by an event before the saver's first put;
- each `put` is one ctxapp checkpoint of that agent (`POST /api/v1/agents/{agent}/checkpoints`,
  so the thread gets ctxapp's delta storage, diff and dashboard timeline). Its cognitive state's
  `working_memory.langgraph` holds the thread, namespace, checkpoint id and parent id, the
  checkpoint (channel values one by one) and its metadata. A value that is plain JSON is stored as
  JSON (`{"json": …}`, readable and diffable); anything else goes through LangGraph's own serde
  (JsonPlusSerializer) as `{"type": …, "b64": …}`. A value too large for the state (over 1 MiB
  packed, or past 3 MiB of the checkpoint's values, largest first) is stored as a blob of the
  agent (`PUT /api/v1/agents/{agent}/blobs/{sha256}`) and the state keeps
  `{"type": …, "blob": <sha256>, "size": …}`. `reason` is `langgraph` plus the namespace,
  `produced_by` the checkpoint id, `step` the metadata's step;
- `put_writes` records one `agent.langgraph.writes` event on the agent's stream (checkpoint id,
  namespace, task id and path, and the writes in the same encoding, a value past the event's
  160 KiB, largest first, as a blob reference); `get_tuple` and `list` read
  them back keyed by (namespace, checkpoint id, task id, index), wherever they sit in the stream,
  sorted as LangGraph sorts them, a regular write kept once per (task, index) and a special one
  (error, interrupt…) replaced;
- `list(None)` lists every thread (agents with the prefix); `delete_thread` deletes the agent
  (its checkpoints, events and blobs);
  `copy_thread`, `prune` and `delete_for_runs` rewrite whole threads (_langgraph_threads.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ctxapp.client import AsyncClient, Client, CtxappError
from ctxapp.integrations._langgraph_core import (
    DONE,
    Call,
    Codec,
    Steps,
    delete_thread_steps,
    put_steps,
    put_writes_steps,
    resume,
    tuples_steps,
)
from ctxapp.integrations._langgraph_threads import copy_thread_steps, delete_for_runs_steps, prune_steps

__all__ = ["CtxappSaver"]


def _outcome(call: Call, client: Client) -> tuple[Any, CtxappError | None]:
    try:
        return call.on(client), None
    except CtxappError as exc:
        return None, exc


async def _aoutcome(call: Call, client: AsyncClient) -> tuple[Any, CtxappError | None]:
    try:
        return await call.on(client), None
    except CtxappError as exc:
        return None, exc


def _drive(steps: Steps, client: Client) -> Iterator[CheckpointTuple]:
    """Carry out an operation's calls with the sync client, yielding what it finds."""
    item = resume(steps)
    while item is not DONE:
        if isinstance(item, Call):
            item = resume(steps, *_outcome(item, client))
        else:
            yield item
            item = resume(steps)


async def _adrive(steps: Steps, client: AsyncClient) -> AsyncIterator[CheckpointTuple]:
    """Carry out an operation's calls with the async client, yielding what it finds."""
    item = resume(steps)
    while item is not DONE:
        if isinstance(item, Call):
            item = resume(steps, *(await _aoutcome(item, client)))
        else:
            yield item
            item = resume(steps)


class CtxappSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in ctxapp. Give it a sync `Client`, an `AsyncClient`, or both (the
    sync methods need the first, the `a…` methods the second)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        agent_prefix: str = "langgraph-",
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if client is None and async_client is None:
            raise ValueError("CtxappSaver needs a ctxapp Client, an AsyncClient, or both.")
        self.client = client
        self.async_client = async_client
        self.codec = Codec(self.serde, agent_prefix)
        # Agent ids known to exist (no lookup before their reads), and the blobs each holds (blob:…).
        self._known: set[str] = set()

    # --- helpers -----------------------------------------------------------------------------
    @property
    def _sync(self) -> Client:
        if self.client is None:
            raise RuntimeError("This CtxappSaver has only an AsyncClient: use the a… methods.")
        return self.client

    @property
    def _async(self) -> AsyncClient:
        if self.async_client is None:
            raise RuntimeError("This CtxappSaver has only a sync Client: use the sync methods.")
        return self.async_client

    def _query(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
        exact_ns: bool = False,
    ) -> Steps:
        """The steps of a `get_tuple` (exact_ns: no namespace is the root one) or a `list` (config
        None: every thread)."""
        configurable = (config or {}).get("configurable", {})
        checkpoint_ns = configurable.get("checkpoint_ns")
        return tuples_steps(
            self.codec,
            configurable.get("thread_id"),
            (checkpoint_ns or "") if exact_ns else checkpoint_ns,
            get_checkpoint_id(config) if config else None,
            before=get_checkpoint_id(before) if before else None,
            filter=filter,
            limit=limit,
            known=self._known,
        )

    def _run(self, steps: Steps) -> None:
        for _ in _drive(steps, self._sync):
            pass

    async def _arun(self, steps: Steps) -> None:
        async for _ in _adrive(steps, self._async):
            pass

    # --- sync ----------------------------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return next(_drive(self._query(config, limit=1, exact_ns=True), self._sync), None)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        steps = self._query(config, filter=filter, before=before, limit=limit)
        yield from _drive(steps, self._sync)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._run(put_steps(self.codec, config, checkpoint, metadata, self._known))
        return self._stored_config(config, checkpoint)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._run(put_writes_steps(self.codec, config, writes, task_id, task_path, self._known))

    def delete_thread(self, thread_id: str) -> None:
        self._run(delete_thread_steps(self.codec, thread_id, self._known))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(copy_thread_steps(self.codec, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(prune_steps(self.codec, thread_ids, strategy, self._known))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(delete_for_runs_steps(self.codec, run_ids, self._known))

    # --- async ---------------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        async for found in _adrive(self._query(config, limit=1, exact_ns=True), self._async):
            return found
        return None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        steps = self._query(config, filter=filter, before=before, limit=limit)
        async for found in _adrive(steps, self._async):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        await self._arun(put_steps(self.codec, config, checkpoint, metadata, self._known))
        return self._stored_config(config, checkpoint)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._arun(put_writes_steps(self.codec, config, writes, task_id, task_path, self._known))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun(delete_thread_steps(self.codec, thread_id, self._known))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun(copy_thread_steps(self.codec, source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun(prune_steps(self.codec, thread_ids, strategy, self._known))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun(delete_for_runs_steps(self.codec, run_ids, self._known))

    # --- shared --------------------------------------------------------------------------------
    @staticmethod
    def _stored_config(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": config["configurable"]["thread_id"],
                "checkpoint_ns": config["configurable"].get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def get_next_version(self, current: str | None, channel: None) -> str:
        # Versions as InMemorySaver makes them: zero-padded counters compare correctly as strings.
        number = 0 if current is None else int(str(current).split(".")[0])
        return f"{number + 1:032}"
