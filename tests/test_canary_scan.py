"""After a user is forgotten (or a message redacted), a canary string written into every kind of
content is found nowhere: not by search (words or meaning), not in a context build, not on a
dashboard page, and in no row of any table. The table scan reads every text, varchar, json and
jsonb column of every table of the database through information_schema, so a table added later is
covered without touching this test. Real PostgreSQL, the real embedding model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client

from memory.models import Membership, MembershipRole, Session, Summary, Tenant, UserMemory
from memory.services import message_indexing
from memory.services.rolling_summary import session_summarise
from memory.services.session_digest import session_digest_update
from memory.services.store import Put, StoreScope, store_put
from memory.services.user_memory.extraction import session_memories_extract
from memory.services.user_memory.store import memory_record

pytestmark = pytest.mark.django_db

CANARY = "Zebraquartz7731canary"  # one word for every tokeniser: found by words if anywhere
REDACT_CANARY = "Marmoset4409redacted"
TEXT_TYPES = ("text", "character varying", "json", "jsonb", "character")


def rows_holding(needle: str) -> dict[str, int]:
    """Every (table.column) of the database whose rows hold `needle` (case-insensitive), with counts."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND data_type = ANY(%s) "
            "AND table_name IN (SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE')",
            [list(TEXT_TYPES)],
        )
        columns = cursor.fetchall()
        assert len(columns) > 100, "the scan must see the whole schema"
        found = {}
        for table, column in columns:
            cursor.execute(f'SELECT count(*) FROM "{table}" WHERE "{column}"::text ILIKE %s', [f"%{needle}%"])
            count = cursor.fetchone()[0]
            if count:
                found[f"{table}.{column}"] = count
    return found


def appended(api: Any, session_id: str, messages: list[dict[str, Any]], **headers: str) -> None:
    response = api.post(
        f"/api/v1/sessions/{session_id}/messages", {"messages": messages}, format="json", **headers
    )
    assert response.status_code == 201, response.content


def filler(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"Ordinary turn {i} about the garden."}
            for i in range(n)]  # fmt: skip


@pytest.fixture
def admin(tenant_a: Tenant, make_client: Any) -> Any:
    return make_client(tenant_a, ["admin"])


@pytest.fixture
def web(tenant_a: Tenant) -> Client:
    user = get_user_model().objects.create_user(username="olga", password="x" * 20)
    Membership.objects.create(user=user, tenant=tenant_a, role=MembershipRole.OPERATOR)
    client = Client()
    client.force_login(user)
    return client


def seed_everything(api: Any, tenant: Tenant, *, user_id: str, agent: str, canary: str) -> str:
    """A session of `user_id` with `canary` in every kind of content; returns its id."""
    created = api.post(
        "/api/v1/sessions", {"agent": agent, "user_id": user_id, "metadata": {"note": canary}}, format="json"
    )
    assert created.status_code == 201, created.content
    sid = created.json()["id"]
    appended(
        api,
        sid,
        [
            {"role": "user",
             "content": f"We decided the launch code word is {canary}, and I prefer to keep it secret.",
             "artifact_refs": [f"s3://bucket/{canary}.txt"]},
            {"role": "assistant", "content": "Looking it up.",
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "lookup", "arguments": json.dumps({"q": canary})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": f"found {canary} in the vault"},
            *filler(24),
        ],
        HTTP_IDEMPOTENCY_KEY=f"append-{agent}",
    )  # fmt: skip
    session = Session.objects.get(public_id=sid)
    event = api.post(f"/api/v1/agents/{agent}/events",
                     {"type": "agent.thought", "session": sid, "payload": {"text": f"remember {canary}"}},
                     format="json")  # fmt: skip
    assert event.status_code == 201, event.content
    fact = api.post(
        f"/api/v1/sessions/{sid}/facts",
        {"key": "code", "type": "constraint", "content": f"The code word is {canary}"},
        format="json",
    )
    assert fact.status_code == 201, fact.content
    experience = api.post("/api/v1/experiences",
                          {"problem": f"User forgot {canary}", "solution": "Remind them", "user_id": user_id},
                          format="json")  # fmt: skip
    assert experience.status_code == 201, experience.content
    checkpoint = api.post(
        f"/api/v1/agents/{agent}/checkpoints",
        {"state": {"schema_version": 1, "working_memory": {"code": canary}}},
        format="json",
    )
    assert checkpoint.status_code == 201, checkpoint.content
    task = api.post("/api/v1/tasks",
                    {"agent": agent, "session": sid, "title": "t", "input": f"find {canary}"},
                    format="json")  # fmt: skip
    assert task.status_code == 201, task.content
    memory_record(tenant=tenant, user_id=user_id, subject="secret.word", text=f"Their code word is {canary}")
    store_put(scope=StoreScope(tenant=tenant), put=Put(namespace=("users", user_id, "notes"), key="k",
                                                        value={"text": canary}, texts=[canary]))  # fmt: skip
    assert session_summarise(tenant=tenant, session=session) is not None
    session_digest_update(tenant=tenant, session=session)
    build = api.post(f"/api/v1/sessions/{sid}/context", {"input": f"What about {canary}?"}, format="json",
                     HTTP_IDEMPOTENCY_KEY=f"build-{agent}")  # fmt: skip
    assert build.status_code == 200, build.content
    message_indexing.memory_index_drain()
    return sid


def nowhere_to_be_seen(api: Any, web: Client, canary: str, *, session_ids: list[str], agent: str) -> None:
    """Search by words and meaning, a context build, the dashboard's pages: no trace of `canary`."""
    for query in (canary, "What is the user's secret launch code word?"):
        body = api.post("/api/v1/memory/search", {"query": query, "scope": {"sessions": "all"}, "limit": 50},
                        format="json")  # fmt: skip
        assert body.status_code == 200, body.content
        results = json.dumps(body.json()["results"], ensure_ascii=False)  # the query itself is echoed
        assert body.json()["results"] and canary.lower() not in results.lower(), query
    other = api.post("/api/v1/sessions", {"agent": agent, "user_id": "someone-else"}, format="json").json()[
        "id"
    ]
    build = api.post(f"/api/v1/sessions/{other}/context", {"input": "What is the secret launch code word?"},
                     format="json")  # fmt: skip
    assert build.status_code == 200, build.content
    assert canary.lower() not in build.content.decode().lower()
    pages = ["/", "/sessions/", f"/agents/{agent}/", f"/agents/{agent}/events", "/experiences/", "/jobs/"]
    pages += [f"/sessions/{sid}/" for sid in session_ids] + [
        f"/sessions/{sid}/messages" for sid in session_ids
    ]
    for url in pages:
        page = web.get(url)
        assert page.status_code in (200, 404), (url, page.status_code)
        assert canary.lower() not in page.content.decode().lower(), url
    box = web.get("/memory/search", {"q": canary}, HTTP_HX_REQUEST="true")
    assert canary.lower() not in box.content.decode().lower()
    assert rows_holding(canary) == {}


def test_a_forgotten_users_canary_is_found_nowhere(api_a, admin, tenant_a, web) -> None:
    kept = seed_everything(api_a, tenant_a, user_id="u2", agent="shared-bot", canary="Keptword5521")
    sid = seed_everything(api_a, tenant_a, user_id="u1", agent="canary-bot", canary=CANARY)
    before = rows_holding(CANARY)
    for table in ("message", "event", "summary", "sessiondigest", "trackedfact", "usermemory", "experience",
                  "checkpoint", "storeitem", "task", "session", "idempotencyrecord"):  # fmt: skip
        assert any(column.startswith(f"memory_{table}.") for column in before), (table, before)

    response = admin.delete("/api/v1/users/u1")
    assert response.status_code == 200, response.content
    nowhere_to_be_seen(api_a, web, CANARY, session_ids=[sid], agent="canary-bot")
    # Another user's content is untouched, and forgetting again erases nothing more.
    assert "memory_message.content" in rows_holding("Keptword5521")
    assert Session.objects.filter(public_id=kept).exists()
    assert set(admin.delete("/api/v1/users/u1").json()["counts"].values()) == {0}


def test_a_redacted_messages_canary_is_gone_from_every_copy_of_it(api_a, tenant_a, web) -> None:
    sid = seed_everything(api_a, tenant_a, user_id="u7", agent="redact-bot", canary=REDACT_CANARY)
    assert Summary.objects.filter(session__public_id=sid, text__icontains=REDACT_CANARY).exists()
    # The canary was written into turns 1-3; every other kind quotes or derives from them, or was
    # written by the API caller (fact, experience, checkpoint, task, store, user memory, event):
    # a redaction answers for the message's copies only, so those are cleared by their own APIs.
    for seq in (1, 2, 3):
        response = api_a.post(f"/api/v1/sessions/{sid}/messages/{seq}/redact", {}, format="json")
        assert response.status_code == 200, response.content
    message_indexing.memory_index_drain()
    left = set(rows_holding(REDACT_CANARY))
    # What is left is only what the caller wrote itself, outside the message's copies.
    written_by_the_caller = {
        "memory_session.metadata", "memory_message.artifact_refs", "memory_event.payload",
        "memory_trackedfact.content", "memory_experience.problem", "memory_experience.aliases",
        "memory_checkpoint.payload", "memory_cognitivestate.document", "memory_task.input",
        "memory_usermemory.text", "memory_storeitem.value", "memory_storeitem.texts",
    }  # fmt: skip
    assert left <= written_by_the_caller, left - written_by_the_caller
    assert "memory_message.artifact_refs" in left  # the scan does see the session's rows


SESSION_CANARY = "Quokka6620deleted"


def test_a_deleted_sessions_canary_is_gone_from_everything_derived_from_it(api_a, tenant_a, web) -> None:
    sid = seed_everything(api_a, tenant_a, user_id="u8", agent="delete-bot", canary=SESSION_CANARY)
    appended(api_a, sid, [{"role": "user", "content": f"I live in {SESSION_CANARY}ville."}])
    session_memories_extract(session=Session.objects.get(public_id=sid))
    assert UserMemory.objects.filter(
        text__contains=SESSION_CANARY, sources__contains=[{"session": sid}]
    ).exists()
    message_indexing.memory_index_drain()

    assert api_a.delete(f"/api/v1/sessions/{sid}").status_code == 204
    message_indexing.memory_index_drain()
    # What is left is what the caller wrote outside the session: the agent's checkpoint, an
    # experience and a user memory recorded without a source in it, the store, and the task (which
    # outlives its session, unlinked). Everything the session held or that was derived from its
    # turns alone (messages, summaries, digests, facts, context builds, the extracted memory,
    # stored answers, events) is gone.
    written_outside_the_session = {
        "memory_checkpoint.payload", "memory_cognitivestate.document", "memory_experience.problem",
        "memory_experience.aliases", "memory_storeitem.value", "memory_storeitem.texts", "memory_task.input",
        "memory_usermemory.text",
    }  # fmt: skip
    left = set(rows_holding(SESSION_CANARY))
    assert left <= written_outside_the_session, left - written_outside_the_session
    assert [m.sources for m in UserMemory.objects.filter(text__contains=SESSION_CANARY)] == [[]]
    found = api_a.post("/api/v1/memory/search", {"query": SESSION_CANARY, "limit": 50}, format="json").json()
    kinds = {hit["kind"] for hit in found["results"] if SESSION_CANARY.lower() in hit["text"].lower()}
    assert kinds <= {"experience", "user_memory"}, found["results"]
    for url in (f"/sessions/{sid}/", f"/sessions/{sid}/messages", "/agents/delete-bot/events"):
        page = web.get(url)
        assert page.status_code in (200, 404) and SESSION_CANARY.lower() not in page.content.decode().lower()
