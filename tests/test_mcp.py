"""The MCP server, driven by the official `mcp` SDK client over both transports against a live server:
streamable HTTP at /mcp (bearer key) and `ctxapp mcp` over stdio (REST client underneath)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.stdio import stdio_client as stdio_client_transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from memory.models import Experience, Message, Session, Tenant, TrackedFact, UserMemory
from memory.services.tenancy import api_key_create, api_key_revoke
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)

TOOLS = {
    "memory_search",
    "remember",
    "context_build",
    "session_start",
    "session_end",
    "experience_record",
    "recovered_state",
    "decay_report",
    "memory_list",
    "memory_update",
    "memory_forget",
}


@pytest.fixture
def keys(transactional_db: None) -> dict[str, Any]:
    alice = Tenant.objects.create(name="Alice's team", slug="alice")
    bob = Tenant.objects.create(name="Bob's team", slug="bob")
    _, alice_key = api_key_create(tenant=alice, name="mcp")
    _, bob_key = api_key_create(tenant=bob, name="mcp")
    revoked, revoked_key = api_key_create(tenant=alice, name="old")
    api_key_revoke(api_key=revoked)
    _, read_only = api_key_create(tenant=alice, name="reader", scopes=["read"])
    return {"alice": alice, "bob": bob, "alice_key": alice_key, "bob_key": bob_key,
            "revoked_key": revoked_key, "read_only": read_only}  # fmt: skip


@pytest.fixture
def server(keys: dict[str, Any]) -> Iterator[str]:
    with uvicorn_server(worker_env()) as base:
        yield base


def http_client(base: str, key: str) -> Client:
    transport = streamable_http_client(
        f"{base}/mcp", http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    )
    return Client(transport)


def stdio_client(base: str, key: str) -> Client:
    env = {"CTXAPP_URL": base, "CTXAPP_API_KEY": key, "CTXAPP_DATA_DIR": "/nonexistent-ctxapp-data"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "ctxapp.cli", "mcp"], env=env)
    return Client(params)


def listed_tools(base: str, key: str, transport: str) -> dict[str, Any]:
    """The tools the key is shown, by name, over `transport` (http or stdio)."""
    make = http_client if transport == "http" else stdio_client

    async def go() -> Any:
        async with make(base, key) as client:
            return (await client.list_tools()).tools

    return {tool.name: tool for tool in asyncio.run(go())}


def data(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def _conversation(client: Client) -> dict[str, Any]:
    """What an agent does in one session, through the tools; returns what it saw."""
    seen: dict[str, Any] = {}
    async with client:
        listed = await client.list_tools()
        seen["tools"] = {t.name: t for t in listed.tools}
        session = data(await client.call_tool("session_start", {"agent": "mcp-bot", "user_id": "u-1"}))
        seen["session"] = session
        sid = session["id"]
        seen["message"] = data(
            await client.call_tool(
                "remember", {"session": sid, "content": "The deploy fails with ENOSPC on /var."}
            )
        )
        seen["fact"] = data(
            await client.call_tool(
                "remember",
                {"session": sid, "kind": "fact", "fact_type": "constraint",
                 "content": "Never restart the primary database during business hours."},
            )
        )  # fmt: skip
        seen["context"] = data(
            await client.call_tool("context_build", {"session": sid, "input": "What now?"})
        )
        seen["experience"] = data(
            await client.call_tool(
                "experience_record",
                {"problem": "Deploy fails with ENOSPC on /var", "cause": "old release directories",
                 "solution": "prune releases older than 5", "confidence": 0.8},
            )
        )  # fmt: skip
        seen["search"] = data(await client.call_tool("memory_search", {"query": "ENOSPC deploy"}))
        seen["decay"] = data(await client.call_tool("decay_report", {"session": sid}))
        seen["recovered"] = data(await client.call_tool("recovered_state", {"agent": "mcp-bot"}))
        seen["ended"] = data(await client.call_tool("session_end", {"session": sid}))
        seen["missing"] = await client.call_tool("decay_report", {"session": "ses_doesnotexist"})
    return seen


def _assert_conversation(seen: dict[str, Any], tenant: Tenant) -> None:
    assert set(seen["tools"]) == TOOLS
    for tool in seen["tools"].values():
        assert tool.description and len(tool.description) > 40
        assert tool.input_schema["type"] == "object"
    assert seen["tools"]["remember"].input_schema["required"] == ["content"]
    kinds = set(seen["tools"]["remember"].input_schema["properties"]["kind"]["enum"])
    assert kinds == {"message", "fact", "user_memory"}
    session = Session.objects.get(tenant=tenant, public_id=seen["session"]["id"])
    assert session.agent.external_id == "mcp-bot"
    assert seen["message"]["seq"] == 1
    assert Message.objects.get(session=session, seq=1).content == "The deploy fails with ENOSPC on /var."
    fact = TrackedFact.objects.get(session=session)
    assert fact.content.startswith("Never restart") and seen["fact"]["type"] == "constraint"
    contents = json.dumps(seen["context"]["messages"])
    assert "ENOSPC" in contents and "Never restart the primary" in contents
    assert seen["context"]["budget"]["prompt_tokens"] > 0
    assert Experience.objects.filter(tenant=tenant, problem="Deploy fails with ENOSPC on /var").exists()
    found = {(hit["kind"], hit["id"]) for hit in seen["search"]["results"]}
    assert ("experience", seen["experience"]["id"]) in found
    assert ("message", f"{session.public_id}:1") in found  # the turn itself, found by its words
    assert set(seen["tools"]["memory_search"].input_schema["properties"]["kinds"]["items"]["enum"]) == {
        "message", "summary", "fact", "experience", "user_memory"}  # fmt: skip
    assert seen["decay"]["session"] == session.public_id and seen["decay"]["items"] == []
    assert "next_cursor" in seen["decay"] and seen["decay"]["next_cursor"] is None
    assert seen["recovered"]["session"]["id"] == session.public_id
    assert seen["ended"]["status"] == "ended"
    assert seen["missing"].is_error and seen["missing"].content[0].text.startswith("not_found: ")


def test_streamable_http_tools_work_for_the_keys_tenant(server: str, keys: dict[str, Any]) -> None:
    seen = asyncio.run(_conversation(http_client(server, keys["alice_key"])))
    _assert_conversation(seen, keys["alice"])
    # /mcp is outside Django but measured like a route
    text = httpx.get(f"{server}/metrics", timeout=30).text
    line = 'ctxapp_http_request_duration_seconds_count{method="POST",route="mcp",status="2xx"}'
    counted = [float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)]
    assert counted and counted[0] >= 11  # initialize, tools/list, the ten tool calls (and notifications)


def test_stdio_server_calls_the_rest_api(server: str, keys: dict[str, Any]) -> None:
    seen = asyncio.run(_conversation(stdio_client(server, keys["alice_key"])))
    _assert_conversation(seen, keys["alice"])


@pytest.mark.parametrize("header", [None, "Bearer ctx_nope_nope", "Basic abc", "revoked"])
def test_http_without_a_usable_key_is_refused_with_json(
    server: str, keys: dict[str, Any], header: str | None
) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if header == "revoked":
        header = f"Bearer {keys['revoked_key']}"
    if header:
        headers["Authorization"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    response = httpx.post(f"{server}/mcp", json=body, headers=headers, timeout=30)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == ("unauthenticated" if header is None else "invalid_api_key") and error["message"]
    if header == f"Bearer {keys['revoked_key']}":
        assert "revoked" in error["message"]


def test_the_sdk_client_with_a_bad_key_fails_to_connect(server: str, keys: dict[str, Any]) -> None:
    async def connect() -> None:
        async with http_client(server, "ctx_0000dead_notakey") as client:
            await client.list_tools()

    with pytest.raises(ExceptionGroup) as refused:  # the SDK's task group carries its MCPError
        asyncio.run(connect())
    assert refused.group_contains(MCPError, depth=None)


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_read_only_key_is_shown_and_allowed_only_the_read_tools(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    make = http_client if transport == "http" else stdio_client

    async def go() -> tuple[set[str], Any]:
        async with make(server, keys["read_only"]) as client:
            listed = {tool.name for tool in (await client.list_tools()).tools}
            return listed, await client.call_tool("session_start", {"agent": "reader"})

    listed, result = asyncio.run(go())
    assert listed == {"memory_search", "recovered_state", "decay_report", "memory_list"}
    assert result.is_error and result.content[0].text.startswith("forbidden: ")
    assert "'write' scope" in result.content[0].text
    assert not Session.objects.exists()


def test_tenants_are_isolated_over_both_transports(server: str, keys: dict[str, Any]) -> None:
    async def alice_session() -> str:
        async with http_client(server, keys["alice_key"]) as client:
            session = data(await client.call_tool("session_start", {"agent": "alice-bot"}))
            await client.call_tool("experience_record", {"problem": "Alice's secret outage runbook"})
            return str(session["id"])

    sid = asyncio.run(alice_session())

    async def bob_tries(client: Client) -> list[Any]:
        async with client:
            return [
                await client.call_tool("remember", {"session": sid, "content": "bob was here"}),
                await client.call_tool("context_build", {"session": sid}),
                await client.call_tool("session_end", {"session": sid}),
                await client.call_tool("recovered_state", {"agent": "alice-bot"}),
                await client.call_tool("memory_search", {"query": "secret outage runbook"}),
            ]

    for client in (http_client(server, keys["bob_key"]), stdio_client(server, keys["bob_key"])):
        *refused, search = asyncio.run(bob_tries(client))
        for result in refused:
            assert result.is_error and "not_found" in result.content[0].text
        assert data(search)["results"] == []
    assert Message.objects.count() == 0
    assert Session.objects.get(public_id=sid).status == "open"


def test_a_key_bound_to_an_agent_acts_only_as_that_agent(server: str, keys: dict[str, Any]) -> None:
    _, bound = api_key_create(tenant=keys["alice"], name="bound", agent_external_id="alice-bot")

    async def go() -> dict[str, Any]:
        async with http_client(server, keys["alice_key"]) as client:
            other = data(await client.call_tool("session_start", {"agent": "other-bot"}))["id"]
        async with http_client(server, bound) as client:
            own = data(await client.call_tool("session_start", {"agent": "alice-bot"}))
            return {
                "own": own,
                "start_other": await client.call_tool("session_start", {"agent": "other-bot"}),
                "remember_other": await client.call_tool("remember", {"session": other, "content": "x"}),
                "recover_other": await client.call_tool("recovered_state", {"agent": "other-bot"}),
                "recover_own": await client.call_tool("recovered_state", {"agent": "alice-bot"}),
            }

    seen = asyncio.run(go())
    assert seen["own"]["agent"] == "alice-bot"
    for name in ("start_other", "remember_other", "recover_other"):
        assert seen[name].is_error and "agent_mismatch" in seen[name].content[0].text, name
    assert not seen["recover_own"].is_error
    assert Message.objects.count() == 0


async def _earlier_session_recalled(client: Client) -> dict[str, Any]:
    """Session 1 says something; session 2 (same agent and user) asks about it through memory_search."""
    async with client:
        first = data(await client.call_tool("session_start", {"agent": "travel-bot", "user_id": "mia"}))
        for content in ("Hi, I need help planning a trip.", "My sister's wedding is in Lisbon on June 14.",
                        "Also book me a window seat."):  # fmt: skip
            data(await client.call_tool("remember", {"session": first["id"], "content": content}))
        data(await client.call_tool("session_end", {"session": first["id"]}))
        keyed = {"agent": "travel-bot", "user_id": "mia", "key": "trip-2027"}
        second = data(await client.call_tool("session_start", keyed))
        # Started again with the same key (after a restart, say): the same session, not a new one.
        assert data(await client.call_tool("session_start", keyed))["id"] == second["id"]
        data(
            await client.call_tool(
                "remember", {"session": second["id"], "content": "Where is the wedding again?"}
            )
        )
        query = "which city is my sister's wedding in"
        return {
            "first": first["id"],
            "second": second["id"],
            "all": data(await client.call_tool("memory_search", {"query": query, "session": second["id"]})),
            "current": data(
                await client.call_tool(
                    "memory_search", {"query": query, "session": second["id"], "sessions": "current"}
                )
            ),
            "messages_only": data(
                await client.call_tool(
                    "memory_search",
                    {"query": query, "user_id": "mia", "kinds": ["message"], "neighbours": 1, "limit": 3},
                )
            ),
            "bad_kind": await client.call_tool("memory_search", {"query": query, "kinds": ["nope"]}),
            "empty": await client.call_tool("memory_search", {"query": "  "}),
        }


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_memory_search_finds_what_was_said_in_an_earlier_session(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    make = http_client if transport == "http" else stdio_client
    seen = asyncio.run(_earlier_session_recalled(make(server, keys["alice_key"])))
    best = seen["all"]["results"][0]
    assert (best["kind"], best["session"], best["seq"]) == ("message", seen["first"], 2)
    assert "Lisbon" in best["text"] and best["score"] > 0 and "lexical" in best["contributions"]
    # only the current session: the earlier session's turn is not there
    assert all(
        hit["session"] == seen["second"] for hit in seen["current"]["results"] if hit["kind"] == "message"
    )
    assert not any("Lisbon" in hit["text"] for hit in seen["current"]["results"])
    hits = seen["messages_only"]["results"]
    assert hits and {hit["kind"] for hit in hits} == {"message"} and len(hits) <= 3
    assert hits[0]["id"] == f"{seen['first']}:2"
    assert [n["seq"] for n in hits[0]["neighbours"]] == [1, 3]
    assert seen["bad_kind"].is_error and seen["empty"].is_error
    assert "validation_error" in seen["empty"].content[0].text


def test_a_bound_key_searches_only_its_agents_memory(server: str, keys: dict[str, Any]) -> None:
    _, bound = api_key_create(tenant=keys["alice"], name="bound", agent_external_id="alice-bot")

    async def go() -> dict[str, Any]:
        async with http_client(server, keys["alice_key"]) as client:
            for agent, text in (("alice-bot", "The alpha launch code is AZURE."),
                                ("other-bot", "The beta launch code is CRIMSON.")):  # fmt: skip
                sid = data(await client.call_tool("session_start", {"agent": agent}))["id"]
                data(await client.call_tool("remember", {"session": sid, "content": text}))
        async with http_client(server, bound) as client:
            return {
                "own": data(await client.call_tool("memory_search", {"query": "launch code"})),
                "other": await client.call_tool(
                    "memory_search", {"query": "launch code", "agent": "other-bot"}
                ),
                "other_session": await client.call_tool(  # sid: other-bot's session
                    "memory_search", {"query": "launch code", "session": sid, "sessions": "current"}
                ),
            }

    seen = asyncio.run(go())
    texts = [hit["text"] for hit in seen["own"]["results"]]
    assert any("AZURE" in t for t in texts) and not any("CRIMSON" in t for t in texts)
    assert seen["other"].is_error and "agent_mismatch" in seen["other"].content[0].text
    assert seen["other_session"].is_error and "agent_mismatch" in seen["other_session"].content[0].text


def test_ctxapp_mcp_without_a_key_says_so(tmp_path: Any) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in {"CTXAPP_API_KEY", "CTXAPP_URL"}}
    env.update({"HOME": str(tmp_path), "CTXAPP_DATA_DIR": str(tmp_path)})
    result = subprocess.run(
        [sys.executable, "-m", "ctxapp.cli", "mcp"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 2 and "No API key" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""  # nothing that an MCP client would misread as a message


# --- what an LLM host sees: schemas, annotations, errors -------------------------------------


def _rest_fields() -> dict[tuple[str, str], Any]:
    """(tool, parameter) → the field of the REST input serializer that validates it."""
    from memory.api.context import SessionContextApi
    from memory.api.decay import FactsApi
    from memory.api.experiences import ExperienceListApi
    from memory.api.memory import MemorySearchApi, ScopeSerializer
    from memory.api.sessions import SessionListCreateApi
    from memory.api.users import UserMemoryDetailApi, UserMemoryListApi

    def fields(serializer: Any, names: dict[str, str]) -> dict[str, Any]:
        declared = serializer().fields
        return {parameter: declared[name] for parameter, name in names.items()}

    same = lambda *names: {name: name for name in names}  # noqa: E731
    by_tool = {
        "memory_search": {
            **fields(MemorySearchApi.InputSerializer, same("query", "limit", "neighbours")),
            **fields(ScopeSerializer, same("agent", "user_id", "session", "sessions")),
        },
        "session_start": fields(
            SessionListCreateApi.InputSerializer, same("agent", "user_id", "model", "key")
        ),
        "context_build": fields(SessionContextApi.InputSerializer, same("input", "model")),
        "experience_record": fields(
            ExperienceListApi.InputSerializer, same("problem", "solution", "cause", "confidence", "user_id")
        ),
        "decay_report": fields(FactsApi.ListQuerySerializer, same("cursor", "limit")),
        "remember": {
            **fields(FactsApi.InputSerializer, {"key": "key"}),
            **fields(UserMemoryListApi.InputSerializer, {"subject": "subject"}),
        },
        "memory_list": fields(UserMemoryListApi.FilterSerializer, same("limit")),
        "memory_update": fields(UserMemoryDetailApi.PatchSerializer, same("text", "confidence")),
    }
    return {(tool, parameter): field for tool, named in by_tool.items() for parameter, field in named.items()}


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_every_tool_is_described_bounded_and_annotated(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    tools = listed_tools(server, keys["alice_key"], transport)
    assert set(tools) == TOOLS
    for name, tool in tools.items():
        assert tool.description and "\n" not in tool.description and "  " not in tool.description, name
        assert tool.annotations is not None, name
        hints = (tool.annotations.read_only_hint, tool.annotations.destructive_hint,
                 tool.annotations.idempotent_hint)  # fmt: skip
        assert None not in hints, name
        for parameter, schema in tool.input_schema["properties"].items():
            assert len(schema.get("description", "")) > 10, (name, parameter)
    for (name, parameter), field in _rest_fields().items():  # the REST serializer's bounds, no others
        schema = tools[name].input_schema["properties"][parameter]
        bounds = (schema.get("minimum"), schema.get("maximum"), schema.get("maxLength"))
        rest = (getattr(field, "min_value", None), getattr(field, "max_value", None),
                getattr(field, "max_length", None) or getattr(field, "max_bytes", None))  # fmt: skip
        assert bounds == rest, (name, parameter)
    assert tools["memory_search"].input_schema["properties"]["limit"]["maximum"] == 100
    read_only = {name for name, tool in tools.items() if tool.annotations.read_only_hint}
    assert read_only == {"memory_search", "recovered_state", "decay_report", "memory_list"}
    assert {name for name, tool in tools.items() if tool.annotations.destructive_hint} == {"memory_forget"}


KINDS_LISTED = ["message", "summary", "fact", "experience", "user_memory"]

# Each bad call, and the REST request with the same body, which must be refused with the same code;
# the tool's message names the tool's argument (the REST field may be named otherwise or nested).
BAD_CALLS: list[tuple[str, str, dict[str, Any], str, str, dict[str, Any], str]] = [
    # (case, tool, arguments, REST method, REST path ({sid}: the session), REST body, argument named)
    ("nul content", "remember", {"content": "a\u0000b"}, "POST", "/sessions/{sid}/messages",
     {"role": "user", "content": "a\u0000b"}, "content"),
    ("nul model", "context_build", {"model": "\u0000"}, "POST", "/sessions/{sid}/context",
     {"model": "\u0000"}, "model"),
    ("nul input", "context_build", {"input": "a\u0000b"}, "POST", "/sessions/{sid}/context",
     {"input": "a\u0000b"}, "input"),
    ("nul query", "memory_search", {"query": "deploy \u0000"}, "POST", "/memory/search",
     {"query": "deploy \u0000"}, "query"),
    ("missing problem", "experience_record", {"solution": "s"}, "POST", "/experiences", {"solution": "s"},
     "problem"),
    ("mistyped limit", "memory_search", {"query": "x", "limit": "ten"}, "POST", "/memory/search",
     {"query": "x", "limit": "ten"}, "limit"),
    ("limit over", "memory_search", {"query": "x", "limit": 101}, "POST", "/memory/search",
     {"query": "x", "limit": 101}, "limit"),
    ("confidence over", "experience_record", {"problem": "p", "confidence": 1.5}, "POST", "/experiences",
     {"problem": "p", "confidence": 1.5}, "confidence"),
    ("fact type", "remember", {"content": "c", "kind": "fact", "fact_type": "Not A Type", "key": "k"},
     "POST", "/sessions/{sid}/facts", {"content": "c", "type": "Not A Type", "key": "k"}, "fact_type"),
    ("agent too long", "memory_search", {"query": "x", "agent": "a" * 201}, "POST", "/memory/search",
     {"query": "x", "scope": {"agent": "a" * 201}}, "agent"),
    ("user memory text", "remember", {"kind": "user_memory", "user_id": "u-1", "subject": "s", "content": ""},
     "POST", "/users/u-1/memories", {"subject": "s", "text": ""}, "content"),
    ("user memory type", "remember",
     {"kind": "user_memory", "user_id": "u-1", "subject": "s", "content": "c", "memory_type": "guess"},
     "POST", "/users/u-1/memories", {"subject": "s", "text": "c", "type": "guess"}, "memory_type"),
    ("empty user turn", "remember", {"content": ""}, "POST", "/sessions/{sid}/messages",
     {"role": "user", "content": ""}, "content"),
]  # fmt: skip


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_bad_arguments_are_refused_as_rest_refuses_them_naming_the_tools_argument(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    make = http_client if transport == "http" else stdio_client
    headers = {"Authorization": f"Bearer {keys['alice_key']}"}
    sid = httpx.post(f"{server}/api/v1/sessions", json={"agent": "strict-bot", "user_id": "u-1"},
                     headers=headers).json()["id"]  # fmt: skip

    async def go() -> dict[str, Any]:
        async with make(server, keys["alice_key"]) as client:
            seen = {}
            for case, tool, arguments, *_ in BAD_CALLS:
                needs_session = (
                    tool in {"remember", "context_build"} and arguments.get("kind") != "user_memory"
                )
                seen[case] = await client.call_tool(
                    tool, {**arguments, **({"session": sid} if needs_session else {})}
                )
            seen["unknown argument"] = await client.call_tool("session_start", {"agent": "a", "agnet": "b"})
            seen["no session"] = await client.call_tool("remember", {"content": "hello"})
            seen["no content"] = await client.call_tool("remember", {"session": sid})
            seen["nul session"] = await client.call_tool("session_end", {"session": "sess_\u0000"})
            seen["bad kind"] = await client.call_tool("memory_search", {"query": "x", "kinds": ["nope"]})
            return seen

    seen = asyncio.run(go())
    for case, _, _, method, path, body, argument in BAD_CALLS:
        rest = httpx.request(method, f"{server}/api/v1{path.format(sid=sid)}", json=body, headers=headers)
        assert 400 <= rest.status_code < 500, (case, rest.text)
        error = rest.json()["error"]
        text = seen[case].content[0].text
        assert seen[case].is_error, case
        assert text.startswith(f"{error['code']}: {argument}: "), (case, text)
        assert "The request body is not valid." not in text, case
        field = error["message"].partition(": ")[0]
        if field == argument:  # the REST field is the argument: the same words
            assert text == f"{error['code']}: {error['message']}", case
    assert seen["nul content"].content[0].text.startswith("validation_error: content: ")
    assert seen["unknown argument"].content[0].text.startswith("validation_error: agnet: Unknown field.")
    assert seen["no session"].content[0].text == "validation_error: session: This field is required."
    assert seen["no content"].content[0].text == "validation_error: content: This field is required."
    assert seen["nul session"].content[0].text.startswith("not_found: ")
    kinds = set(KINDS_LISTED)
    bad_kind = seen["bad kind"].content[0].text
    assert bad_kind.startswith("validation_error: kinds") and "nope" in bad_kind
    assert {k for k in re.findall(r"[a-z_]+", bad_kind.split("kinds are", 1)[1])} == kinds
    assert Message.objects.count() == 0 and TrackedFact.objects.count() == 0
    assert not Experience.objects.exists() and not UserMemory.objects.exists()


def _unbounded(schema: dict[str, Any]) -> str | None:
    """Why an argument's schema lets through a value the server refuses for its size (None: bounded)."""
    kind = schema.get("type")
    if kind == "string" and not (
        {"maxLength", "enum"} & schema.keys() or schema.get("format") == "date-time"
    ):
        return "a string without maxLength, enum or format date-time"
    if kind == "array":
        if "maxItems" not in schema:
            return "an array without maxItems"
        return _unbounded(schema.get("items", {}))
    if kind in ("integer", "number") and not {"minimum", "maximum"} <= schema.keys():
        return "a number without minimum and maximum"
    return None


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_every_argument_of_every_tool_states_the_servers_bounds(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    from django.conf import settings

    tools = listed_tools(server, keys["alice_key"], transport)
    assert set(tools) == TOOLS
    unbounded = {
        (name, argument): why
        for name, tool in tools.items()
        for argument, schema in tool.input_schema["properties"].items()
        if (why := _unbounded(schema)) is not None
    }
    assert unbounded == {}
    search = tools["memory_search"].input_schema["properties"]
    assert (
        search["kinds"]["maxItems"] == len(KINDS_LISTED) and search["kinds"]["items"]["enum"] == KINDS_LISTED
    )
    assert all(search[name]["maxLength"] for name in ("session", "agent", "user_id"))
    assert (
        tools["remember"].input_schema["properties"]["content"]["maxLength"]
        == settings.CTXAPP.message_max_bytes
    )
    assert tools["memory_list"].input_schema["properties"]["as_of"]["format"] == "date-time"
    assert tools["decay_report"].input_schema["properties"]["cursor"]["maxLength"] > 0


def test_the_stdio_server_does_not_log_each_http_request(
    server: str, keys: dict[str, Any], tmp_path: Any
) -> None:
    env = {"CTXAPP_URL": server, "CTXAPP_API_KEY": keys["alice_key"], "CTXAPP_DATA_DIR": "/nonexistent"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "ctxapp.cli", "mcp"], env=env)
    errors = tmp_path / "stderr.txt"

    async def go() -> None:
        with errors.open("w") as errlog:
            async with Client(stdio_client_transport(params, errlog=errlog)) as client:
                await client.list_tools()
                data(await client.call_tool("session_start", {"agent": "quiet-bot"}))

    asyncio.run(go())
    assert Session.objects.filter(agent__external_id="quiet-bot").exists()  # requests were made
    assert "HTTP Request" not in errors.read_text()


def test_the_stdio_server_with_a_bad_key_says_so_in_one_line(
    server: str, keys: dict[str, Any], tmp_path: Any
) -> None:
    env = {"CTXAPP_URL": server, "CTXAPP_API_KEY": "ctx_0000dead_notakey", "CTXAPP_DATA_DIR": "/nonexistent"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "ctxapp.cli", "mcp"], env=env)
    errors = tmp_path / "stderr.txt"

    async def go() -> None:
        with errors.open("w") as errlog:
            async with Client(stdio_client_transport(params, errlog=errlog)) as client:
                await client.list_tools()

    with pytest.raises(BaseException):  # noqa: B017 - the SDK reports the closed pipe as it may
        asyncio.run(go())
    lines = errors.read_text().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines[:5]
    assert "invalid_api_key" in lines[0] and server in lines[0]


async def _resources(client: Client, sid: str) -> dict[str, Any]:
    async with client:
        listed = await client.list_resources()
        templates = await client.list_resource_templates()
        sessions = await client.read_resource("ctxapp://sessions")
        messages = await client.read_resource(f"ctxapp://sessions/{sid}/messages")
        return {"listed": listed, "templates": templates, "sessions": sessions, "messages": messages}


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_sessions_and_a_sessions_recent_messages_are_resources(
    server: str, keys: dict[str, Any], transport: str
) -> None:
    make = http_client if transport == "http" else stdio_client
    headers = {"Authorization": f"Bearer {keys['alice_key']}"}
    sid = httpx.post(f"{server}/api/v1/sessions", json={"agent": "res-bot"}, headers=headers).json()["id"]
    turns = [{"role": "user", "content": f"turn {n}"} for n in range(1, 61)]
    appended = httpx.post(
        f"{server}/api/v1/sessions/{sid}/messages", json={"messages": turns}, headers=headers
    )
    assert appended.status_code == 201, appended.text

    seen = asyncio.run(_resources(make(server, keys["alice_key"]), sid))
    assert [str(r.uri) for r in seen["listed"].resources] == ["ctxapp://sessions"]
    assert [t.uri_template for t in seen["templates"].resource_templates] == [
        "ctxapp://sessions/{session}/messages"
    ]
    sessions = json.loads(seen["sessions"].contents[0].text)
    assert [s["id"] for s in sessions["items"]] == [sid]
    recent = json.loads(seen["messages"].contents[0].text)["items"]
    assert [m["content"] for m in recent] == [f"turn {n}" for n in range(11, 61)]  # the newest 50

    async def bob_reads(client: Client) -> tuple[Any, Any]:
        async with client:
            mine = await client.read_resource("ctxapp://sessions")
            try:
                await client.read_resource(f"ctxapp://sessions/{sid}/messages")
            except MCPError as exc:
                return mine, exc
            return mine, None

    mine, refused = asyncio.run(bob_reads(make(server, keys["bob_key"])))
    assert json.loads(mine.contents[0].text)["items"] == []
    assert refused is not None and "not_found" in str(refused)


# --- one auth vocabulary, and the limits of /api/v1 on /mcp ------------------------------------

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


def _post(base: str, path: str, key: str | None) -> httpx.Response:
    headers = dict(MCP_HEADERS)
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body: Any = TOOLS_LIST if path == "/mcp" else {}
    if path == "/api/v1/sessions":
        body = {"agent": "vocab-bot"}
    return httpx.post(f"{base}{path}", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("path", ["/api/v1/sessions", "/mcp", "/v1/traces"])
def test_a_missing_and_a_wrong_key_have_one_code_on_every_surface(
    server: str, keys: dict[str, Any], path: str
) -> None:
    missing = _post(server, path, None)
    wrong = _post(server, path, "ctx_0000dead_notakey")
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "unauthenticated")
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (401, "invalid_api_key")
    assert wrong.headers["www-authenticate"] == 'Bearer realm="api"'


@pytest.fixture
def lockout_server(keys: dict[str, Any]) -> Iterator[str]:
    # An hour's window: none ends during the test (a minute's could). Only this server counts
    # failures per hour, so the lockout of 127.0.0.1 it leaves behind reaches no other test.
    with uvicorn_server({**worker_env(), "CTXAPP_THROTTLE_AUTH_FAILURE_RATE": "3/h"}) as base:
        yield base


@pytest.fixture
def limited_server(keys: dict[str, Any]) -> Iterator[str]:
    env = {
        **worker_env(),
        "CTXAPP_THROTTLE_KEY_RATE": "6/d",  # a day's window: none ends during the test
        "CTXAPP_MAX_BODY_BYTES": "65536",
        "CTXAPP_MCP_STREAMS_PER_KEY": "1",
        "CTXAPP_MCP_STREAMS_TOTAL": "2",
        "CTXAPP_MCP_STREAM_IDLE_SECONDS": "3",
    }
    with uvicorn_server(env) as base:
        yield base


def test_wrong_keys_on_mcp_lock_the_address_out_as_on_the_api(
    lockout_server: str, keys: dict[str, Any]
) -> None:
    limited_server = lockout_server
    answers = [_post(limited_server, "/mcp", "ctx_0000dead_notakey").status_code for _ in range(4)]
    assert answers == [401, 401, 401, 429]
    # the address is locked out: a good key is refused too, on /mcp and on /api/v1 alike
    locked = _post(limited_server, "/mcp", keys["alice_key"])
    assert locked.status_code == 429 and locked.json()["error"]["code"] == "rate_limited"
    assert int(locked.headers["retry-after"]) > 0
    assert _post(limited_server, "/api/v1/sessions", keys["alice_key"]).status_code == 429


def test_mcp_requests_count_against_the_keys_rate_limit(limited_server: str, keys: dict[str, Any]) -> None:
    answers = [_post(limited_server, "/mcp", keys["bob_key"]).status_code for _ in range(7)]
    assert answers == [200] * 6 + [429]
    # the same limit as /api/v1: the key is over it there too, another key is not
    assert _post(limited_server, "/api/v1/sessions", keys["bob_key"]).status_code == 429
    assert _post(limited_server, "/mcp", keys["alice_key"]).status_code == 200


def test_event_streams_are_capped_and_end_when_idle(limited_server: str, keys: dict[str, Any]) -> None:
    _, carol = api_key_create(tenant=keys["alice"], name="carol")
    headers = {"Accept": "text/event-stream"}

    def stream(http: httpx.Client, key: str) -> Any:
        return http.stream(
            "GET", f"{limited_server}/mcp", headers={**headers, "Authorization": f"Bearer {key}"}
        )

    with httpx.Client(timeout=30) as http:
        with stream(http, keys["alice_key"]) as first:
            assert first.status_code == 200
            second = http.get(
                f"{limited_server}/mcp", headers={**headers, "Authorization": f"Bearer {keys['alice_key']}"}
            )
            assert (
                second.status_code == 429 and "This API key has reached" in second.json()["error"]["message"]
            )
            with stream(http, keys["bob_key"]) as other:
                assert other.status_code == 200  # another key: its own cap; two streams in total
                third = http.get(
                    f"{limited_server}/mcp", headers={**headers, "Authorization": f"Bearer {carol}"}
                )
                assert (
                    third.status_code == 429 and "The server has reached" in third.json()["error"]["message"]
                )
                # idle (no event, pings aside): the server ends the stream by itself (read timeout 30 s)
                for _ in other.iter_bytes():
                    pass
            for _ in first.iter_bytes():
                pass
        # ended streams no longer count: a new one is accepted
        with stream(http, keys["alice_key"]) as again:
            assert again.status_code == 200


def test_a_body_over_the_limit_is_refused_on_mcp_as_on_the_api(
    limited_server: str, keys: dict[str, Any]
) -> None:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {keys['alice_key']}"}
    big = {**TOOLS_LIST, "params": {"padding": "x" * 70_000}}
    for path in ("/mcp", "/api/v1/sessions"):
        response = httpx.post(f"{limited_server}{path}", json=big, headers=headers, timeout=30)
        assert response.status_code == 413, path
        assert response.json()["error"]["code"] == "payload_too_large", path
