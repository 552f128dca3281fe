"""User memory through the Python client, sync in process and async over a live server: the same
answers as the REST API, typed, and the API's errors as the client's exceptions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.utils import timezone

from ctxapp import client as ctx
from memory.models import UserMemory
from memory.services.sessions import session_create
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db


def test_the_sync_client_records_corrects_lists_and_erases(alice: Any, tenant_a: Any) -> None:
    session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-7")
    first = alice.user_memory_create("u-7", "home.city", "Lives in Porto", type="profile")
    assert first["outcome"] == "created" and first["type"] == "profile"
    between = timezone.now()
    fixed = alice.user_memory_update("u-7", first["id"], text="Moved to Lisbon")
    assert fixed["outcome"] == "superseded" and fixed["supersedes"] == first["id"]
    assert [m["text"] for m in alice.user_memories_list("u-7")["items"]] == ["Moved to Lisbon"]
    assert [m["text"] for m in alice.user_memories_list("u-7", as_of=between)["items"]] == ["Lives in Porto"]
    alice.user_memory_create("u-7", "pet", "Has a puppy named Miso", type="fact")
    assert {m["subject"] for m in alice.user_memories_iter("u-7")} == {"home.city", "pet"}
    assert alice.user_memory_get("u-7", first["id"])["current"] is False
    history = alice.user_memory_history("u-7", fixed["id"])["items"]
    assert [m["id"] for m in history] == [first["id"], fixed["id"]]

    with pytest.raises(ctx.Conflict) as stale:
        alice.user_memory_update("u-7", first["id"], text="Moved to Faro")
    assert stale.value.code == "memory_superseded"
    with pytest.raises(ctx.ValidationFailed):
        alice.user_memory_create("u-7", "x", "")
    with pytest.raises(ctx.NotFound):
        alice.user_memories_list("nobody")

    assert alice.user_memory_delete("u-7", fixed["id"]) == {"deleted": [first["id"], fixed["id"]], "count": 2}
    with pytest.raises(ctx.NotFound):
        alice.user_memory_get("u-7", fixed["id"])
    assert list(UserMemory.objects.values_list("subject", flat=True)) == ["pet"]


@pytest.mark.django_db(transaction=True)
def test_the_async_client_does_the_same(live_server: Any, tenant_a: Any) -> None:
    secret = api_key_create(tenant=tenant_a, name="client-test")[1]
    session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-8")

    async def scenario() -> tuple[Any, ...]:
        async with ctx.AsyncClient(live_server.url, secret) as api:
            created = await api.user_memory_create("u-8", "diet", "Vegetarian", type="preference")
            updated = await api.user_memory_update("u-8", created["id"], confidence=0.4)
            listed = await api.user_memories_list("u-8", type="preference")
            every = [m async for m in api.user_memories_iter("u-8")]
            history = await api.user_memory_history("u-8", updated["id"])
            deleted = await api.user_memory_delete("u-8", updated["id"])
            return created, updated, listed, every, history, deleted

    created, updated, listed, every, history, deleted = asyncio.run(scenario())
    assert updated["outcome"] == "superseded" and updated["confidence"] == 0.4
    assert updated["text"] == created["text"] == "Vegetarian"
    assert [m["id"] for m in listed["items"]] == [updated["id"]] == [m["id"] for m in every]
    assert [m["confidence"] for m in history["items"]] == [1.0, 0.4]
    assert deleted["count"] == 2 and not UserMemory.objects.filter(user_id="u-8").exists()
