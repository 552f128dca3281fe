"""User memory through the REST API, on the real database and the real embedder: a new value
supersedes the old one and `as_of` still shows it, corrections are new versions, erasure takes the
earlier versions with it, and nobody reaches a user they may not (Bob never sees Alice's users)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from django.utils import timezone

from memory.models import EmbeddingStatus, Event, IdempotencyRecord, JobIntent, Tenant, UserMemory
from memory.services import jobs
from memory.services.embedding import embed_query
from memory.services.sessions import session_create
from memory.services.tenancy import api_key_create
from memory.services.user_memory.store import memory_record
from memory.tasks import jobs as job_kinds  # registers what each job kind runs, as a worker does

pytestmark = pytest.mark.django_db

USER = "u-42"
BASE = f"/api/v1/users/{USER}/memories"


@pytest.fixture
def user(tenant_a: Tenant) -> str:
    session_create(tenant=tenant_a, agent_external_id="agent-a", user_id=USER)
    return USER


def post(client: Any, body: dict[str, Any], *, user_id: str = USER, **headers: Any) -> Any:
    return client.post(f"/api/v1/users/{user_id}/memories", body, format="json", **headers)


def error_code(response: Any) -> str:
    return str(response.json()["error"]["code"])


def test_a_new_value_supersedes_and_as_of_shows_the_old_one(api_a: Any, user: str, tenant_a: Tenant) -> None:
    first = post(api_a, {"subject": "home.city", "text": "Lives in Porto", "type": "profile"})
    assert first.status_code == 201, first.content
    assert first.json()["outcome"] == "created" and first.json()["current"] is True
    between = timezone.now()
    second = post(api_a, {"subject": "home.city", "text": "Moved to Lisbon", "type": "profile"})
    assert second.status_code == 201
    assert second.json()["outcome"] == "superseded" and second.json()["supersedes"] == first.json()["id"]

    now = api_a.get(BASE).json()
    assert [m["text"] for m in now["items"]] == ["Moved to Lisbon"] and now["next"] is None
    past = api_a.get(BASE, {"as_of": between.isoformat()})
    assert past.status_code == 200
    assert [(m["text"], m["current"]) for m in past.json()["items"]] == [("Lives in Porto", False)]
    assert past.json()["items"][0]["superseded_by"] == second.json()["id"]
    before = api_a.get(BASE, {"as_of": "2001-01-01T00:00:00Z"}).json()
    assert before["items"] == []

    history = api_a.get(f"{BASE}/{second.json()['id']}/history").json()["items"]
    assert [m["text"] for m in history] == ["Lives in Porto", "Moved to Lisbon"]
    assert history[0]["valid_to"] == history[1]["valid_from"]

    payloads = list(
        Event.objects.filter(tenant=tenant_a, type__startswith="user_memory.").values_list(
            "payload", flat=True
        )
    )
    assert len(payloads) == 3 and not any("Lisbon" in str(p) or "Porto" in str(p) for p in payloads)
    assert api_a.get(BASE, {"as_of": "yesterday"}).status_code == 422


def test_repeating_the_current_text_is_unchanged_and_type_filters(api_a: Any, user: str) -> None:
    post(api_a, {"subject": "pet", "text": "Has a puppy named Miso"})
    again = post(api_a, {"subject": "pet", "text": "has a puppy  named MISO"})
    assert again.status_code == 200 and again.json()["outcome"] == "unchanged"
    post(api_a, {"subject": "diet", "text": "Vegetarian", "type": "preference"})
    assert [m["subject"] for m in api_a.get(BASE, {"type": "preference"}).json()["items"]] == ["diet"]
    assert api_a.get(BASE, {"type": "mood"}).status_code == 422
    page = api_a.get(BASE, {"limit": 1}).json()
    assert len(page["items"]) == 1 and page["next"]
    rest = api_a.get(BASE, {"limit": 1, "cursor": page["next"]}).json()
    assert {page["items"][0]["subject"], rest["items"][0]["subject"]} == {"pet", "diet"}


def test_patch_writes_a_new_version_and_a_superseded_one_is_409(api_a: Any, user: str) -> None:
    first = post(api_a, {"subject": "job", "text": "Works at Acme", "confidence": 0.6}).json()
    fixed = api_a.patch(f"{BASE}/{first['id']}", {"text": "Works at Initech"}, format="json")
    assert fixed.status_code == 201, fixed.content
    body = fixed.json()
    assert body["id"] != first["id"] and body["supersedes"] == first["id"] and body["subject"] == "job"
    assert body["confidence"] == 0.6 and body["embedding_status"] == "pending"
    old = api_a.get(f"{BASE}/{first['id']}").json()
    assert old["text"] == "Works at Acme" and old["current"] is False and old["superseded_by"] == body["id"]

    stale = api_a.patch(f"{BASE}/{first['id']}", {"text": "Works at Globex"}, format="json")
    assert stale.status_code == 409 and error_code(stale) == "memory_superseded"
    assert stale.json()["error"]["details"]["superseded_by"] == body["id"]
    same = api_a.patch(f"{BASE}/{body['id']}", {"text": "Works at Initech"}, format="json")
    assert same.status_code == 200 and same.json()["outcome"] == "unchanged"
    typed = api_a.patch(f"{BASE}/{body['id']}", {"type": "profile"}, format="json")
    assert typed.status_code == 201 and typed.json()["type"] == "profile"
    assert [m["text"] for m in api_a.get(BASE).json()["items"]] == ["Works at Initech"]
    assert UserMemory.objects.filter(user_id=USER, subject="job").count() == 3


def test_empty_text_and_unknown_fields_are_422_and_write_nothing(api_a: Any, user: str) -> None:
    empty = post(api_a, {"subject": "x", "text": "   "})
    assert empty.status_code == 422 and "text" in empty.json()["error"]["details"]["fields"]
    unknown = post(api_a, {"subject": "x", "text": "t", "valid": True})
    assert unknown.status_code == 422 and "valid" in unknown.json()["error"]["details"]["fields"]
    created = post(api_a, {"subject": "x", "text": "t"}).json()
    blank = api_a.patch(f"{BASE}/{created['id']}", {"text": ""}, format="json")
    assert blank.status_code == 422 and "text" in blank.json()["error"]["details"]["fields"]
    nothing = api_a.patch(f"{BASE}/{created['id']}", {}, format="json")
    assert nothing.status_code == 422
    stray = api_a.patch(f"{BASE}/{created['id']}", {"subject": "y"}, format="json")
    assert stray.status_code == 422 and "subject" in stray.json()["error"]["details"]["fields"]
    assert UserMemory.objects.filter(user_id=USER).count() == 1


def test_an_unknown_user_and_another_tenants_are_404_alike(api_a: Any, api_b: Any, user: str) -> None:
    memory = post(api_a, {"subject": "home", "text": "Lisbon"}).json()
    for client, user_id in ((api_a, "nobody"), (api_b, USER)):
        base = f"/api/v1/users/{user_id}/memories"
        responses = [
            client.get(base),
            client.post(base, {"subject": "home", "text": "Paris"}, format="json"),
            client.get(f"{base}/{memory['id']}"),
            client.patch(f"{base}/{memory['id']}", {"text": "Paris"}, format="json"),
            client.delete(f"{base}/{memory['id']}"),
            client.get(f"{base}/{memory['id']}/history"),
        ]
        assert [r.status_code for r in responses] == [404] * 6
        assert {error_code(r) for r in responses} == {"not_found"}
    # Bob's own user of that name does not reach Alice's memory id either.
    tenant_b = api_b.api_key.tenant
    session_create(tenant=tenant_b, agent_external_id="bot", user_id=USER)
    assert api_b.get(BASE).json()["items"] == []
    assert api_b.get(f"{BASE}/{memory['id']}").status_code == 404
    assert api_b.delete(f"{BASE}/{memory['id']}").status_code == 404
    assert UserMemory.objects.get(public_id=memory["id"]).text == "Lisbon"


def test_a_user_known_only_by_a_memory_exists(api_a: Any, tenant_a: Tenant) -> None:
    memory_record(tenant=tenant_a, user_id="from-import", subject="home", text="Oslo")
    assert [m["text"] for m in api_a.get("/api/v1/users/from-import/memories").json()["items"]] == ["Oslo"]


def test_a_read_key_reads_but_cannot_write(make_client: Any, tenant_a: Tenant, api_a: Any, user: str) -> None:
    memory = post(api_a, {"subject": "home", "text": "Lisbon"}).json()
    reader = make_client(tenant_a, ["read"])
    assert reader.get(BASE).status_code == 200
    assert reader.get(f"{BASE}/{memory['id']}/history").status_code == 200
    refused = [
        post(reader, {"subject": "home", "text": "Paris"}),
        reader.patch(f"{BASE}/{memory['id']}", {"text": "Paris"}, format="json"),
        reader.delete(f"{BASE}/{memory['id']}"),
    ]
    assert [r.status_code for r in refused] == [403] * 3
    assert {error_code(r) for r in refused} == {"forbidden"}
    assert list(UserMemory.objects.values_list("text", flat=True)) == ["Lisbon"]


def test_a_bound_key_reaches_only_users_of_its_agents_sessions(
    tenant_a: Tenant, api_a: Any, user: str
) -> None:
    session_create(tenant=tenant_a, agent_external_id="agent-b", user_id="u-b")
    memory = post(api_a, {"subject": "home", "text": "Lisbon"}).json()
    clients = {}
    for agent in ("agent-a", "agent-b"):
        _, secret = api_key_create(tenant=tenant_a, name=agent, agent_external_id=agent)
        clients[agent] = type(api_a)()
        clients[agent].credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    b = clients["agent-b"]
    responses = [
        b.get(BASE),
        post(b, {"subject": "home", "text": "Paris"}),
        b.get(f"{BASE}/{memory['id']}"),
        b.patch(f"{BASE}/{memory['id']}", {"text": "Paris"}, format="json"),
        b.delete(f"{BASE}/{memory['id']}"),
        b.get(f"{BASE}/{memory['id']}/history"),
    ]
    assert [r.status_code for r in responses] == [404] * 6
    own = post(b, {"subject": "home", "text": "Berlin"}, user_id="u-b")
    assert own.status_code == 201 and own.json()["agent"] == "agent-b"
    a = clients["agent-a"]
    # "Lisbon" was written by a key bound to no agent: no agent's own, so not a's to read either.
    assert a.get(BASE).json()["items"] == []
    mine = post(a, {"subject": "work", "text": "Acme"})
    assert mine.status_code == 201 and mine.json()["agent"] == "agent-a"
    assert [m["text"] for m in a.get(BASE).json()["items"]] == ["Acme"]
    assert a.get("/api/v1/users/u-b/memories").status_code == 404
    assert UserMemory.objects.get(public_id=memory["id"]).text == "Lisbon"


def test_a_retried_post_and_patch_write_once(api_a: Any, user: str) -> None:
    body = {"subject": "home", "text": "Lisbon"}
    first = post(api_a, body, HTTP_IDEMPOTENCY_KEY="k-1")
    again = post(api_a, body, HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    path = f"{BASE}/{first.json()['id']}"
    patched = api_a.patch(path, {"text": "Porto"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    replay = api_a.patch(path, {"text": "Porto"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert patched.status_code == replay.status_code == 201 and replay.json()["id"] == patched.json()["id"]
    assert UserMemory.objects.filter(user_id=USER).count() == 2
    other = post(api_a, {"subject": "home", "text": "Faro"}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 409 and error_code(other) == "idempotency_conflict"


def test_delete_erases_the_memory_and_its_earlier_versions_only(
    api_a: Any, user: str, tenant_a: Tenant
) -> None:
    v1 = post(api_a, {"subject": "home", "text": "Porto"}, HTTP_IDEMPOTENCY_KEY="c-1").json()
    v2 = post(api_a, {"subject": "home", "text": "Lisbon"}).json()
    v3 = post(api_a, {"subject": "home", "text": "Faro"}).json()
    post(api_a, {"subject": "pet", "text": "Miso"})
    deleted = api_a.delete(f"{BASE}/{v2['id']}")
    assert deleted.status_code == 200 and deleted.json() == {"deleted": [v1["id"], v2["id"]], "count": 2}
    history = api_a.get(f"{BASE}/{v3['id']}/history").json()["items"]
    assert [m["text"] for m in history] == ["Faro"]
    assert {m["text"] for m in api_a.get(BASE).json()["items"]} == {"Faro", "Miso"}
    assert api_a.delete(f"{BASE}/{v2['id']}").status_code == 404
    # The stored answer of the idempotent POST held the text: it is gone with the memory.
    assert not IdempotencyRecord.objects.filter(tenant=tenant_a, key="c-1").exists()
    event = Event.objects.get(tenant=tenant_a, type="user_memory.deleted")
    assert event.payload["memories"] == [v1["id"], v2["id"]] and event.payload["count"] == 2
    assert "Porto" not in str(event.payload) and "Lisbon" not in str(event.payload)
    everything = api_a.delete(f"{BASE}/{v3['id']}")
    assert everything.json()["count"] == 1
    assert [m["text"] for m in api_a.get(BASE).json()["items"]] == ["Miso"]


def _run_embedding_jobs() -> None:
    """What a worker does with the queued intents (memory.jobs.run for each)."""
    assert jobs.USER_MEMORY_EMBED in job_kinds.jobs.HANDLERS
    for intent in JobIntent.objects.filter(kind=jobs.USER_MEMORY_EMBED, status="pending"):
        assert jobs.job_run(intent_id=intent.pk) == "done"


def _cosine(a: Any, b: Any) -> float:
    return float(np.dot(np.asarray(a), np.asarray(b)))


def test_each_version_is_embedded_by_one_coalesced_job(api_a: Any, user: str, tenant_a: Tenant) -> None:
    created = [
        post(api_a, {"subject": f"s{i}", "text": f"Fact number {i} about hiking"}).json() for i in range(3)
    ]
    assert JobIntent.objects.filter(kind=jobs.USER_MEMORY_EMBED, status="pending").count() == 1
    _run_embedding_jobs()
    memory = UserMemory.objects.get(public_id=created[0]["id"])
    assert memory.embedding_status == EmbeddingStatus.COMPLETED and memory.embedding_model
    _, query = embed_query("Fact number 0 about hiking")
    assert _cosine(memory.embedding, query) > 0.99
    assert api_a.get(f"{BASE}/{memory.public_id}").json()["embedding_status"] == "completed"

    fixed = api_a.patch(
        f"{BASE}/{memory.public_id}", {"text": "Sister Lina's wedding is in Sintra"}, format="json"
    )
    new = UserMemory.objects.get(public_id=fixed.json()["id"])
    assert new.embedding_status == EmbeddingStatus.PENDING and new.embedding is None
    _run_embedding_jobs()
    new.refresh_from_db()
    _, wedding = embed_query("Where is Lina's wedding?")
    assert new.embedding_status == EmbeddingStatus.COMPLETED
    assert _cosine(new.embedding, wedding) > _cosine(memory.embedding, wedding) + 0.2
    assert Event.objects.filter(tenant=tenant_a, type="user_memory.embedded").count() == 2
