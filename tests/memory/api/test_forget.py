"""DELETE /api/v1/users/{user_id} and POST /api/v1/sessions/{id}/messages/{seq}/redact over HTTP:
real PostgreSQL, the real embedding model. Scopes, another tenant, bound keys, idempotency."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ctxapp import client as ctx
from memory.models import ContentGeneration, Event, Message, Session, UserMemory
from memory.services import message_indexing
from memory.services.tenancy import api_key_create
from memory.services.user_memory.store import memory_record
from tests.helpers import in_process_transport

pytestmark = pytest.mark.django_db


def session(api: Any, *, agent: str = "bot", user_id: str = "u1") -> str:
    response = api.post("/api/v1/sessions", {"agent": agent, "user_id": user_id}, format="json")
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def append(api: Any, session_id: str, *contents: str) -> None:
    body = {"messages": [{"role": "user", "content": c} for c in contents]}
    response = api.post(f"/api/v1/sessions/{session_id}/messages", body, format="json")
    assert response.status_code == 201, response.content


def search(api: Any, query: str, user_id: str = "u1") -> list[dict[str, Any]]:
    body = {"query": query, "scope": {"user_id": user_id, "sessions": "all"}, "kinds": ["message"]}
    response = api.post("/api/v1/memory/search", body, format="json")
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


@pytest.fixture
def admin_a(tenant_a, make_client):
    return make_client(tenant_a, ["admin"])


def test_forgetting_a_user_erases_their_sessions_and_memories_and_answers_counts(api_a, admin_a, tenant_a):
    first, second = session(api_a), session(api_a, agent="helper")
    kept = session(api_a, user_id="u2")
    append(api_a, first, "My passport number is X1234567.", "I live in Porto.")
    append(api_a, second, "I moved to Lisbon in March.")
    append(api_a, kept, "My passport is in the drawer.")
    memory_record(tenant=tenant_a, user_id="u1", subject="home.city", text="Lives in Lisbon")
    message_indexing.memory_index_drain()
    assert search(api_a, "passport number")  # found before

    response = admin_a.delete("/api/v1/users/u1")
    assert response.status_code == 200, response.content
    counts = response.json()["counts"]
    assert counts["sessions"] == 2 and counts["messages"] == 3 and counts["user_memories"] == 1
    assert counts["events"] >= 3  # session.created and message.added of both sessions, tombstoned
    assert not Session.objects.filter(tenant=tenant_a, user_id="u1").exists()
    assert not UserMemory.objects.filter(tenant=tenant_a, user_id="u1").exists()
    assert search(api_a, "passport number") == []
    assert [r["text"] for r in search(api_a, "passport", user_id="u2")] == ["My passport is in the drawer."]
    audit = Event.objects.get(tenant=tenant_a, type="user.forgotten")
    assert audit.payload["user_id"] == "u1" and "Lisbon" not in str(audit.payload)

    again = admin_a.delete("/api/v1/users/u1")
    assert again.status_code == 200 and set(again.json()["counts"].values()) == {0}


def test_an_unknown_user_and_another_tenants_user_are_404_alike(api_a, admin_a, tenant_b, make_client):
    api_b = make_client(tenant_b, ["admin"])
    append(api_a, session(api_a, user_id="alice-user"), "hello")
    missing = admin_a.delete("/api/v1/users/nobody")
    foreign = api_b.delete("/api/v1/users/alice-user")
    assert missing.status_code == foreign.status_code == 404
    assert missing.json()["error"]["code"] == foreign.json()["error"]["code"] == "not_found"
    assert Message.objects.filter(session__user_id="alice-user").count() == 1


@pytest.mark.parametrize("scopes", [["read"], ["write"], ["read", "write"]])
def test_only_an_admin_key_forgets(api_a, tenant_a, make_client, scopes):
    append(api_a, session(api_a), "hello")
    response = make_client(tenant_a, scopes).delete("/api/v1/users/u1")
    assert response.status_code == 403, response.content
    assert Session.objects.filter(tenant=tenant_a, user_id="u1").exists()


def test_a_bound_key_forgets_only_its_agents_sessions_of_the_user(api_a, tenant_a, make_client):
    mine, theirs = session(api_a, agent="agent-a"), session(api_a, agent="agent-b")
    append(api_a, mine, "secret of a")
    append(api_a, theirs, "secret of b")
    only_b = session(api_a, agent="agent-b", user_id="u3")
    append(api_a, only_b, "u3 talks to b only")
    bound_a = make_client(tenant_a, ["admin"])
    key = bound_a.api_key
    key.agent_external_id = "agent-a"
    key.save()
    response = bound_a.delete("/api/v1/users/u1")
    assert response.status_code == 200, response.content
    assert response.json()["counts"]["sessions"] == 1
    assert list(
        Session.objects.filter(tenant=tenant_a, user_id="u1").values_list("public_id", flat=True)
    ) == [theirs]
    assert bound_a.delete("/api/v1/users/u3").status_code == 404  # not a user of agent-a's sessions
    assert bound_a.delete("/api/v1/users/u1").json()["counts"]["sessions"] == 0  # idempotent


def test_redacting_a_message_replaces_it_in_the_index_and_the_listing(api_a, tenant_a):
    sid = session(api_a)
    append(api_a, sid, "The vault code is 7319 and the door is blue.", "Thanks, noted.")
    message_indexing.memory_index_drain()
    assert search(api_a, "vault code")
    response = api_a.post(f"/api/v1/sessions/{sid}/messages/1/redact", {}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["counts"]["messages"] == 1
    listed = api_a.get(f"/api/v1/sessions/{sid}/messages").json()["items"]
    assert [m["content"] for m in listed] == ["[redacted]", "Thanks, noted."]
    message_indexing.memory_index_drain()
    assert all("vault" not in r["text"] for r in search(api_a, "vault code"))
    row = Message.objects.get(session__public_id=sid, seq=1)
    assert row.embedding is not None and row.embedding_status == "completed"  # embedded again
    audit = Event.objects.get(tenant=tenant_a, type="message.redacted")
    assert "7319" not in str(audit.payload)

    custom = api_a.post(f"/api/v1/sessions/{sid}/messages/2/redact", {"replacement": "[gone]"}, format="json")
    assert custom.status_code == 200
    assert Message.objects.get(session__public_id=sid, seq=2).content == "[gone]"


def test_redact_bad_input(api_a, tenant_a, api_b, make_client):
    sid = session(api_a)
    append(api_a, sid, "one")
    assert api_a.post(f"/api/v1/sessions/{sid}/messages/9/redact", {}, format="json").status_code == 404
    huge = api_a.post(f"/api/v1/sessions/{sid}/messages/{2**63}/redact", {}, format="json")
    assert huge.status_code == 404
    foreign = api_b.post(f"/api/v1/sessions/{sid}/messages/1/redact", {}, format="json")
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
    unknown = api_a.post(f"/api/v1/sessions/{sid}/messages/1/redact", {"nope": 1}, format="json")
    assert unknown.status_code == 422
    read = make_client(tenant_a, ["read"]).post(
        f"/api/v1/sessions/{sid}/messages/1/redact", {}, format="json"
    )
    assert read.status_code == 403
    assert Message.objects.get(session__public_id=sid, seq=1).content == "one"


def test_the_sync_client_redacts_and_forgets(tenant_a, make_client):
    admin = make_client(tenant_a, ["admin"])
    with (
        in_process_transport() as transport,
        ctx.Client("http://testserver", admin.secret, retries=0, transport=transport) as client,
    ):
        sid = client.session_create("bot", user_id="u5")["id"]
        client.messages_append(sid, [{"role": "user", "content": "my pin is 1234"}])
        redacted = client.message_redact(sid, 1, replacement="[pin removed]")
        assert redacted["seq"] == 1 and redacted["counts"]["messages"] == 1
        assert client.messages_list(sid)["items"][0]["content"] == "[pin removed]"
        with pytest.raises(ctx.NotFound):
            client.message_redact(sid, 2)
        assert client.users_forget("u5")["counts"]["sessions"] == 1
        assert set(client.users_forget("u5")["counts"].values()) == {0}
        with pytest.raises(ctx.NotFound):
            client.users_forget("nobody")


@pytest.mark.django_db(transaction=True)
def test_the_async_client_redacts_and_forgets(live_server: Any, tenant_a: Any) -> None:
    secret = api_key_create(tenant=tenant_a, name="admin", scopes=["admin"])[1]

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with ctx.AsyncClient(live_server.url, secret) as api:
            session = await api.session_create("async-bot", user_id="u9")
            await api.messages_append(session["id"], [{"role": "user", "content": "my pin is 1234"}])
            return await api.message_redact(session["id"], 1), await api.users_forget("u9")

    redacted, forgotten = asyncio.run(scenario())
    assert redacted["counts"]["messages"] == 1 and forgotten["counts"]["messages"] == 1


def test_a_same_model_reembedding_moves_the_content_generation(api_a, tenant_a):
    append(api_a, session(api_a), "a message to embed")
    message_indexing.memory_index_drain()
    before = (
        ContentGeneration.objects.filter(tenant=tenant_a).values_list("generation", flat=True).first() or 0
    )
    message_indexing.messages_reembed(tenant=tenant_a)
    assert ContentGeneration.objects.get(tenant=tenant_a).generation == before + 1


def test_the_first_keys_403_for_the_admin_scope_says_how_to_make_an_admin_key(api_a, tenant_a):
    session(api_a)
    for response in (api_a.delete("/api/v1/users/u1"), api_a.get("/api/v1/tenant/api-keys")):
        assert response.status_code == 403, response.content
        error = response.json()["error"]
        assert error["code"] == "forbidden"
        assert f"create_api_key --tenant {tenant_a.slug} --scopes admin" in error["message"], error
        assert "/admin/" in error["message"]
