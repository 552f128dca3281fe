"""CtxappStore side by side with LangGraph's InMemoryStore: the same calls give the same answers
(put/get/delete, namespaces, filters, search by meaning with the same embedder, batches), and TTL,
tenants and bound keys, against a live server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from langgraph.store.base import BaseStore, GetOp, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore

from ctxapp.client import AsyncClient, Client, CtxappError
from ctxapp.integrations.langgraph_store import CtxappStore
from memory.models import StoreItem, Tenant
from memory.services.embedding import EMBEDDING_DIMENSIONS, embedder_get
from memory.services.tenancy import api_key_create

MINE = ("users", "alice", "memories")
MEMORIES = [
    (MINE, "m1", {"text": "Alice is allergic to peanuts", "kind": "health", "n": 1}),
    (MINE, "m2", {"text": "Alice prefers window seats on flights", "kind": "travel", "n": 2}),
    (MINE, "m3", {"text": "Alice's cat is called Miso", "kind": "pets", "n": 3}),
    (("users", "alice", "prefs"), "p1", {"text": "Reply in French", "kind": "style", "n": 4}),
    (("users", "bob", "memories"), "b1", {"text": "Bob lives in Lyon", "kind": "travel", "n": 5}),
]


def _embed(texts: list[str]) -> list[list[float]]:
    return [vector.tolist() for vector in embedder_get().embed(texts)]


def _memory_store() -> InMemoryStore:
    return InMemoryStore(index={"dims": EMBEDDING_DIMENSIONS, "embed": _embed, "fields": ["$"]})


def _shown(found: Any) -> Any:
    """What a caller compares: namespace, key, value (and the score, rounded), not the timestamps."""
    if found is None:
        return None
    if isinstance(found, list):
        return [_shown(item) for item in found]
    if isinstance(found, tuple):
        return found
    score = getattr(found, "score", None)
    return (found.namespace, found.key, found.value, None if score is None else round(score, 3))


def _by_key(shown: list[Any]) -> list[Any]:
    """Items of several namespaces in a stable order (each store has its own across namespaces)."""
    return sorted(shown, key=lambda item: (item[0], item[1]))


def _session(store: BaseStore) -> dict[str, Any]:
    for namespace, key, value in MEMORIES:
        store.put(namespace, key, value)
    store.put(("users", "alice", "memories"), "m2", {**MEMORIES[1][2], "n": 20})  # a re-put
    store.put(("users", "alice", "memories"), "gone", {"text": "temporary", "n": 0})
    store.delete(("users", "alice", "memories"), "gone")
    store.put(("users", "alice", "memories"), "quiet", {"text": "not indexed peanuts", "n": 0}, index=False)
    alice = ("users", "alice")
    return {
        "get": _shown(store.get(("users", "alice", "memories"), "m2")),
        "missing": _shown(store.get(("users", "alice", "memories"), "gone")),
        "one namespace": _shown(store.search(("users", "alice", "memories"))),
        "prefix": _by_key(_shown(store.search(alice, limit=100))),
        "filter": _shown(store.search(alice, filter={"kind": "travel"})),
        "filter op": _by_key(_shown(store.search(("users",), filter={"n": {"$gte": 4}}))),
        "paged": _shown(store.search(("users", "alice", "memories"), limit=2, offset=1)),
        "by meaning": _shown(store.search(alice, query="food allergy", limit=3)),
        "by meaning, filtered": _shown(
            store.search(("users",), query="where do they live", filter={"kind": "travel"})
        ),
        "namespaces": store.list_namespaces(),
        "prefix ns": store.list_namespaces(prefix=("users", "alice")),
        "suffix ns": store.list_namespaces(suffix=("memories",)),
        "wildcard ns": store.list_namespaces(prefix=("users", "*", "prefs")),
        "depth": store.list_namespaces(max_depth=2),
        "ns paged": store.list_namespaces(limit=1, offset=1),
        "batch": _shown(
            store.batch(
                [
                    PutOp(("batch",), "x", {"text": "in a batch", "n": 0}),
                    GetOp(("batch",), "x"),
                    SearchOp(("batch",), limit=5),
                    PutOp(("batch",), "x", None),
                    GetOp(("batch",), "x"),
                ]
            )
        ),
    }


def test_the_same_calls_give_the_same_answers_as_in_memory_store(server: str, alice_key: str) -> None:
    expected = _session(_memory_store())
    ours = _session(CtxappStore(Client(server, alice_key)))
    assert expected["by meaning"][0][1] == "m1"  # the embedder finds the allergy first
    for name in expected:
        assert ours[name] == expected[name], name


def test_the_async_api_answers_as_the_sync_one(server: str, alice_key: str) -> None:
    async def run() -> Any:
        async with AsyncClient(server, alice_key) as client:
            store = CtxappStore(async_client=client)
            await store.aput(("a",), "k", {"text": "hello"})
            item = await store.aget(("a",), "k")
            found = await store.asearch(("a",), query="greeting")
            spaces = await store.alist_namespaces()
            await store.adelete(("a",), "k")
            return item, found, spaces, await store.aget(("a",), "k")

    item, found, spaces, after = asyncio.run(run())
    assert item is not None and item.value == {"text": "hello"} and item.namespace == ("a",)
    assert [f.key for f in found] == ["k"] and found[0].score is not None
    assert spaces == [("a",)] and after is None


def _wait_until_gone(store: CtxappStore, namespace: tuple[str, ...], key: str) -> float:
    started = time.monotonic()
    while store.get(namespace, key, refresh_ttl=False) is not None:
        assert time.monotonic() - started < 20, "the item did not expire"
        time.sleep(0.05)
    return time.monotonic() - started


def test_items_expire_after_their_ttl_and_a_read_refreshes_it(server: str, alice_key: str) -> None:
    store = CtxappStore(Client(server, alice_key), ttl={"default_ttl": 60, "refresh_on_read": True})
    store.put(("t",), "short", {"v": 1}, ttl=0.01)  # 0.6 s
    store.put(("t",), "long", {"v": 2})
    _wait_until_gone(store, ("t",), "short")
    assert store.search(("t",)) and [i.key for i in store.search(("t",))] == ["long"]
    assert store.list_namespaces() == [("t",)]
    row = StoreItem.objects.get(key="long")
    assert row.ttl_minutes == 60 and row.expires_at is not None
    before = row.expires_at
    assert store.get(("t",), "long") is not None  # refresh_on_read
    assert StoreItem.objects.get(key="long").expires_at > before
    store.get(("t",), "long", refresh_ttl=False)
    later = StoreItem.objects.get(key="long").expires_at
    store.get(("t",), "long", refresh_ttl=False)
    assert StoreItem.objects.get(key="long").expires_at == later
    # The expired row is gone once the store is written again.
    assert StoreItem.objects.filter(key="short").exists()
    store.put(("t",), "another", {"v": 3})
    assert not StoreItem.objects.filter(key="short").exists()


def test_another_tenant_and_a_bound_key_have_stores_of_their_own(
    server: str, alice_key: str, bob_key: str
) -> None:
    alice = CtxappStore(Client(server, alice_key))
    alice.put(("notes",), "k", {"secret": "alice's"})
    bob = CtxappStore(Client(server, bob_key))
    assert bob.get(("notes",), "k") is None and bob.list_namespaces() == []
    _, bound_secret = api_key_create(
        tenant=Tenant.objects.get(slug="alice"), name="bot", agent_external_id="bot"
    )
    bot = CtxappStore(Client(server, bound_secret))
    assert bot.get(("notes",), "k") is None
    bot.put(("notes",), "k", {"secret": "bot's"})
    assert alice.get(("notes",), "k").value == {"secret": "alice's"}  # type: ignore[union-attr]
    assert bot.get(("notes",), "k").value == {"secret": "bot's"}  # type: ignore[union-attr]


def test_bad_operations_are_refused_whole(server: str, alice_key: str) -> None:
    client = Client(server, alice_key)
    with pytest.raises(CtxappError) as refused:
        client.store_batch(
            [
                {"op": "put", "namespace": ["ok"], "key": "k", "value": {"a": 1}},
                {"op": "put", "namespace": ["bad.label"], "key": "k", "value": {"a": 1}},
            ]
        )
    assert refused.value.status == 422
    assert StoreItem.objects.count() == 0  # no partial write
    with pytest.raises(CtxappError) as unknown:
        client.store_batch([{"op": "get", "namespace": ["a"], "key": "k", "colour": "red"}])
    assert unknown.value.status == 422 and "colour" in str(unknown.value.details)
    with pytest.raises(CtxappError) as forever:
        client.store_batch([{"op": "put", "namespace": ["a"], "key": "k", "value": {}, "ttl": 1e300}])
    assert forever.value.status == 422 and "ttl" in str(forever.value.details)
    reader_secret = api_key_create(tenant=Tenant.objects.get(slug="alice"), name="r", scopes=["read"])[1]
    reader = CtxappStore(Client(server, reader_secret))
    assert reader.get(("a",), "k") is None
    with pytest.raises(CtxappError) as denied:
        reader.put(("a",), "k", {"v": 1})
    assert denied.value.status == 403


def _postgres_store_code(store: BaseStore) -> dict[str, Any]:
    """Calls written for PostgresStore: setup() first, then puts and searches. Only `text` is
    indexed, so the misleading `note` does not draw a search its way."""
    if hasattr(store, "setup"):
        store.setup()
    notes = ("notes", "alice")
    store.put(notes, "a", {"text": "Alice is allergic to peanuts", "note": "travel flights seats"})
    store.put(notes, "b", {"text": "Alice prefers window seats on flights", "note": "allergy peanuts food"})
    store.put(notes, "c", {"text": "Alice's cat is called Miso", "note": "food"}, index=["note"])
    return {
        "allergy": _shown(store.search(notes, query="food allergy", limit=3)),
        "flights": _shown(store.search(notes, query="seat on a plane", limit=1)),
    }


def test_postgres_store_index_configuration_is_honoured(server: str, alice_key: str) -> None:
    index = {"dims": EMBEDDING_DIMENSIONS, "embed": _embed, "fields": ["text"]}
    expected = _postgres_store_code(InMemoryStore(index=index))  # type: ignore[arg-type]
    assert expected["allergy"][0][1] == "a" and expected["flights"][0][1] == "b"
    ours = _postgres_store_code(CtxappStore(Client(server, alice_key), index=index))  # type: ignore[arg-type]
    assert ours == expected
    # embed as PostgresStore's "provider:model" string, and its own index settings: accepted; the
    # embedding is ctxapp's own, so the answers are the same.
    as_named = CtxappStore(
        Client(server, alice_key),
        index={
            "dims": 1536,
            "embed": "openai:text-embedding-3-small",
            "fields": ["text"],
            "distance_type": "cosine",
        },
    )
    assert as_named.search(("notes", "alice"), query="food allergy", limit=3) == CtxappStore(
        Client(server, alice_key),
        index=index,  # type: ignore[arg-type]
    ).search(("notes", "alice"), query="food allergy", limit=3)
    for bad in ({"fields": "text"}, {"embed": "text-embedding-3-small"}, {"dims": 0}, {"dimension": 3}):
        with pytest.raises(ValueError):
            CtxappStore(Client(server, alice_key), index=bad)  # type: ignore[arg-type]
