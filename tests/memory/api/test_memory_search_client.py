"""The Python client's memory search (sync in-process, async against a live server)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxapp import client as ctx
from memory.services import message_indexing
from memory.services.tenancy import api_key_create


@pytest.mark.django_db
def test_the_sync_client_imports_history_and_searches_it(alice, api_b):
    session = alice.session_create("bot", user_id="u1")
    appended = alice.messages_append(
        session["id"],
        [
            {"role": "user", "name": "Mel", "content": "We painted a sunrise over the lake last weekend.",
             "occurred_at": "2023-07-02T10:00:00+02:00"},
            {"role": "user", "name": "Mel", "content": "The kids loved the pottery class."},
        ],
    )  # fmt: skip
    assert appended["last_seq"] == 2
    stored = alice.messages_list(session["id"])["items"][0]
    assert stored["name"] == "Mel" and stored["occurred_at"].startswith("2023-07-02T08:00:00")
    assert alice.memory_index_status()["pending"] == 2
    message_indexing.memory_index_drain()
    assert alice.memory_index_status() == {"pending": 0, "completed": 2, "failed": 0, "skipped": 0}
    found = alice.memory_search(
        "what did Mel paint?", scope={"user_id": "u1", "sessions": "all"}, limit=1, neighbours=1
    )
    hit = found["results"][0]
    assert hit["id"] == f"{session['id']}:1" and hit["speaker"] == "Mel"
    assert [n["seq"] for n in hit["neighbours"]] == [2]
    with pytest.raises(ctx.ValidationFailed):
        alice.memory_search("")
    with pytest.raises(ctx.ValidationFailed):
        alice.memory_search("x", kinds=["emails"])
    with pytest.raises(ctx.NotFound):
        alice.memory_search("x", scope={"session": "sess_" + "0" * 24})


@pytest.mark.django_db(transaction=True)
def test_the_async_client_searches(live_server: Any, tenant_a: Any) -> None:
    secret = api_key_create(tenant=tenant_a, name="client-test")[1]

    async def scenario() -> dict[str, Any]:
        async with ctx.AsyncClient(live_server.url, secret) as api:
            session = await api.session_create("async-bot", user_id="u9")
            await api.messages_append(
                session["id"], [{"role": "user", "content": "I keep bees on the roof."}]
            )
            await asyncio.to_thread(message_indexing.memory_index_drain)
            assert (await api.memory_index_status())["completed"] == 1
            return await api.memory_search("beekeeping hobby", scope={"user_id": "u9"}, kinds=["message"])

    found = asyncio.run(scenario())
    assert found["results"][0]["text"] == "I keep bees on the roof."
    assert found["results"][0]["kind"] == "message" and found["warnings"] == []


@pytest.mark.django_db
def test_the_client_builds_a_context_with_recall_overrides(alice):
    old = alice.session_create("bot", user_id="u1")
    alice.messages_append(old["id"], [{"role": "user", "content": "My locker code is 4512."}])
    message_indexing.memory_index_drain()
    now = alice.session_create("bot", user_id="u1")
    built = alice.context_build(now["id"], "hello", query="locker code", recall={"top_k": 1})
    recalled = [i for i in built["manifest"]["items"] if i["kind"] == "recall"]
    assert [(i["session"], i["seq"]) for i in recalled] == [(old["id"], 1)]
    assert built["policy"]["recall"]["top_k"] == 1
    off = alice.context_build(now["id"], "locker code?", recall={"enabled": False})
    assert not [i for i in off["manifest"]["items"] if i["kind"] == "recall"]
