"""A LangGraph long-term memory store (`BaseStore`, sync and async) kept in ctxapp.

    from ctxapp.client import Client
    from ctxapp.integrations.langgraph_store import CtxappStore

    store = CtxappStore(
        Client(url, key),
        index={"dims": 1536, "embed": "openai:text-embedding-3-small", "fields": ["text"]},
        ttl={"default_ttl": 60 * 24, "refresh_on_read": True},
    )
    graph = builder.compile(checkpointer=saver, store=store)

Every batch of operations is one `POST /api/v1/store/batch`. Items live server-side per tenant
(a key bound to an agent has a store of its own). Search by meaning: the texts an item is
indexed by (the `fields` of the store's `index`, or a put's `index`, as LangGraph's path
expressions; `index=False`: none; default `["$"]`, the whole value) are embedded by ctxapp's
embedder, and a query ranks items by their best text's cosine. TTL in minutes (`ttl` config or a
put's `ttl`), refreshed on read unless the config or the call says otherwise.

`index` takes PostgresStore's (and InMemoryStore's) configuration as it is, so code written for
them runs unchanged: `fields` is honoured; `embed` (a LangChain `Embeddings`, a sync or async
function, or a "provider:model" string) and `dims` are accepted but the embedding is ctxapp's own
(its embedder, its dimensions: the server embeds, the application's embedder is never called);
PostgresStore's `ann_index_config` and `distance_type` are accepted and left to ctxapp (cosine).
Without `index`, ctxapp still embeds whole values (PostgresStore would not search by meaning).
`setup()` does nothing: the server holds the tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import get_text_at_path

from ctxapp.client import AsyncClient, Client

__all__ = ["CtxappStore"]


# The keys of LangGraph's IndexConfig, and those PostgresStore's PostgresIndexConfig adds.
INDEX_KEYS = frozenset({"dims", "embed", "fields", "ann_index_config", "distance_type"})


def _index_checked(index: IndexConfig | dict[str, Any]) -> dict[str, Any]:
    """`index` as PostgresStore takes it, checked as far as ctxapp uses it (ValueError otherwise)."""
    config = dict(index)
    unknown = sorted(set(config) - INDEX_KEYS)
    if unknown:
        raise ValueError(f"Unknown index setting {unknown[0]!r}; known: {', '.join(sorted(INDEX_KEYS))}.")
    dims = config.get("dims")
    if dims is not None and (isinstance(dims, bool) or not isinstance(dims, int) or dims <= 0):
        raise ValueError(f"index dims must be a positive integer; got {dims!r}.")
    embed = config.get("embed")
    if isinstance(embed, str) and ":" not in embed:
        raise ValueError(
            'index embed as a string is "provider:model" (e.g. "openai:text-embedding-3-small"); '
            f"got {embed!r}."
        )
    if (
        embed is not None
        and not isinstance(embed, str)
        and not callable(embed)
        and not hasattr(embed, "embed_documents")
    ):
        raise ValueError(
            'index embed is an Embeddings, an (async) function of texts, or a "provider:model" string.'
        )
    fields = config.get("fields")
    if fields is not None and (isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
        raise ValueError(f'index fields is a list of paths (e.g. ["text", "notes[*].body"]); got {fields!r}.')
    return config


class CtxappStore(BaseStore):
    """LangGraph's BaseStore over ctxapp. Give it a sync `Client`, an `AsyncClient`, or both;
    `index` and `ttl` as PostgresStore takes them (see the module's docstring for what `index`
    honours)."""

    supports_ttl = True

    def __init__(
        self,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        index_fields: list[str] | None = None,
    ) -> None:
        if client is None and async_client is None:
            raise ValueError("CtxappStore needs a ctxapp Client, an AsyncClient, or both.")
        if index is not None and index_fields is not None:
            raise ValueError("Pass index={'fields': [...]} or index_fields (the older form), not both.")
        self.client = client
        self.async_client = async_client
        self.index_config = _index_checked(index) if index is not None else None
        fields = (self.index_config or {}).get("fields") or index_fields
        self.index_fields = list(fields) if fields else ["$"]
        self.ttl_config = ttl

    def setup(self) -> None:
        """Nothing to do (PostgresStore creates its tables here; the ctxapp server holds them)."""

    async def asetup(self) -> None:
        """Nothing to do (as `setup`)."""

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        if self.client is None:
            raise RuntimeError("This CtxappStore has only an AsyncClient: use the a… methods.")
        ops = list(ops)
        return self._results(ops, self.client.store_batch([self._op(op) for op in ops]))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        if self.async_client is None:
            raise RuntimeError("This CtxappStore has only a sync Client: use the sync methods.")
        ops = list(ops)
        return self._results(ops, await self.async_client.store_batch([self._op(op) for op in ops]))

    # --- encoding ------------------------------------------------------------------------------
    def _texts(self, value: dict[str, Any], index: Any) -> list[str]:
        if index is False:
            return []
        paths = self.index_fields if index is None else list(index)
        return [text for path in paths for text in get_text_at_path(value, path) if text]

    def _op(self, op: Op) -> dict[str, Any]:
        if isinstance(op, GetOp):
            return {
                "op": "get",
                "namespace": list(op.namespace),
                "key": op.key,
                "refresh_ttl": op.refresh_ttl,
            }
        if isinstance(op, PutOp):
            value = None if op.value is None else dict(op.value)
            texts = [] if value is None else self._texts(value, op.index)
            body = {"op": "put", "namespace": list(op.namespace), "key": op.key, "value": value}
            return {**body, "texts": texts, "ttl": op.ttl}
        if isinstance(op, SearchOp):
            body = {"op": "search", "namespace_prefix": list(op.namespace_prefix), "filter": op.filter}
            return {
                **body,
                "limit": op.limit,
                "offset": op.offset,
                "query": op.query,
                "refresh_ttl": op.refresh_ttl,
            }
        if isinstance(op, ListNamespacesOp):
            conditions = {c.match_type: list(c.path) for c in op.match_conditions or ()}
            return {
                "op": "list_namespaces",
                "prefix": conditions.get("prefix"),
                "suffix": conditions.get("suffix"),
                "max_depth": op.max_depth,
                "limit": op.limit,
                "offset": op.offset,
            }
        raise ValueError(f"Unknown store operation: {op!r}")

    @staticmethod
    def _item(shown: dict[str, Any], *, scored: bool) -> Item:
        fields = {
            "namespace": tuple(shown["namespace"]),
            "key": shown["key"],
            "value": shown["value"],
            "created_at": datetime.fromisoformat(shown["created_at"]),
            "updated_at": datetime.fromisoformat(shown["updated_at"]),
        }
        return SearchItem(**fields, score=shown.get("score")) if scored else Item(**fields)

    def _results(self, ops: list[Op], answers: list[Any]) -> list[Result]:
        results: list[Result] = []
        for op, answer in zip(ops, answers, strict=True):
            if isinstance(op, GetOp):
                results.append(None if answer is None else self._item(answer, scored=False))
            elif isinstance(op, SearchOp):
                results.append([self._item(shown, scored=True) for shown in answer])
            elif isinstance(op, ListNamespacesOp):
                results.append([tuple(ns) for ns in answer])
            else:
                results.append(None)
        return results
