"""The user memory tools, driven by the official `mcp` SDK client as an LLM host drives them, over
both transports against a live server: remember a fact about the user, see it superseded, list it
as of a past moment, correct it, forget it; read-only keys and other tenants are refused."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memory.models import UserMemory
from tests.test_mcp import data, http_client, keys, server, stdio_client

__all__ = ["keys", "server"]  # the fixtures of tests/test_mcp.py, used here by name

pytestmark = pytest.mark.django_db(transaction=True)


async def _user_memory_session(client: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    await client.call_tool("session_start", {"agent": "assistant", "user_id": "u-1"})
    remember = {"kind": "user_memory", "user_id": "u-1", "subject": "home.city", "memory_type": "profile"}
    seen["first"] = data(await client.call_tool("remember", {**remember, "content": "Lives in Porto"}))
    seen["second"] = data(await client.call_tool("remember", {**remember, "content": "Moved to Lisbon"}))
    seen["now"] = data(await client.call_tool("memory_list", {"user_id": "u-1"}))
    as_of = seen["first"]["valid_from"]
    seen["then"] = data(await client.call_tool("memory_list", {"user_id": "u-1", "as_of": as_of}))
    seen["stale"] = await client.call_tool(
        "memory_update", {"user_id": "u-1", "memory": seen["first"]["id"], "text": "Moved to Faro"}
    )
    seen["fixed"] = data(
        await client.call_tool(
            "memory_update", {"user_id": "u-1", "memory": seen["second"]["id"], "text": "Moved to Faro"}
        )
    )
    seen["empty"] = await client.call_tool(
        "memory_update", {"user_id": "u-1", "memory": seen["fixed"]["id"], "text": ""}
    )
    seen["no subject"] = await client.call_tool(
        "remember", {"kind": "user_memory", "user_id": "u-1", "content": "x"}
    )
    seen["with session"] = await client.call_tool(
        "remember", {**remember, "session": "sess_x", "content": "Moved to Braga"}
    )
    seen["forgot"] = data(
        await client.call_tool("memory_forget", {"user_id": "u-1", "memory": seen["fixed"]["id"]})
    )
    seen["after"] = data(await client.call_tool("memory_list", {"user_id": "u-1"}))
    seen["nobody"] = await client.call_tool("memory_list", {"user_id": "nobody"})
    return seen


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_the_user_memory_tools_record_supersede_correct_and_forget(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    make = http_client if transport == "http" else stdio_client

    async def go() -> dict[str, Any]:
        async with make(server, keys["alice_key"]) as client:
            return await _user_memory_session(client)

    seen = asyncio.run(go())
    assert seen["first"]["outcome"] == "created" and seen["first"]["type"] == "profile"
    assert seen["second"]["outcome"] == "superseded" and seen["second"]["supersedes"] == seen["first"]["id"]
    assert [m["text"] for m in seen["now"]["items"]] == ["Moved to Lisbon"]
    assert [m["text"] for m in seen["then"]["items"]] == ["Lives in Porto"]
    assert seen["stale"].is_error and seen["stale"].content[0].text.startswith("memory_superseded: ")
    assert seen["fixed"]["outcome"] == "superseded" and seen["fixed"]["text"] == "Moved to Faro"
    assert seen["empty"].is_error and seen["empty"].content[0].text.startswith("validation_error: ")
    assert seen["no subject"].content[0].text == (
        "validation_error: subject: This field is required (kind=user_memory)."
    )
    assert seen["with session"].content[0].text == (
        "validation_error: session: Not with kind=user_memory (it outlives sessions)."
    )
    assert seen["forgot"]["count"] == 3
    assert seen["after"]["items"] == []
    assert seen["nobody"].is_error and seen["nobody"].content[0].text.startswith("not_found: ")
    assert not UserMemory.objects.exists()


def test_read_keys_and_other_tenants_cannot_touch_a_users_memories(server: str, keys: dict[str, Any]) -> None:
    async def go() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with http_client(server, keys["alice_key"]) as alice:
            await alice.call_tool("session_start", {"agent": "assistant", "user_id": "u-1"})
            seen["memory"] = data(
                await alice.call_tool(
                    "remember", {"kind": "user_memory", "user_id": "u-1", "subject": "pet", "content": "Miso"}
                )
            )
        target = {"user_id": "u-1", "memory": seen["memory"]["id"]}
        async with http_client(server, keys["read_only"]) as reader:
            seen["read"] = data(await reader.call_tool("memory_list", {"user_id": "u-1"}))
            seen["forget"] = await reader.call_tool("memory_forget", target)
        async with http_client(server, keys["bob_key"]) as bob:
            seen["bob list"] = await bob.call_tool("memory_list", {"user_id": "u-1"})
            seen["bob forget"] = await bob.call_tool("memory_forget", target)
        return seen

    seen = asyncio.run(go())
    assert [m["text"] for m in seen["read"]["items"]] == ["Miso"]
    assert seen["forget"].is_error and seen["forget"].content[0].text.startswith("forbidden: ")
    for case in ("bob list", "bob forget"):
        assert seen[case].is_error and seen[case].content[0].text.startswith("not_found: "), case
    assert list(UserMemory.objects.values_list("text", flat=True)) == ["Miso"]
