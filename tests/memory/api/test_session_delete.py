"""DELETE /api/v1/sessions/{id} takes what was derived from the session alone, and the embedding cache is
per tenant: real PostgreSQL, the real embedding model, extraction by the offline rules."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from memory.models import EmbeddingCache, Event, Experience, Session, UserMemory
from memory.services import embedding
from memory.services.embedding import text_hash, vectors_cached
from memory.services.user_memory.embed import user_memories_embed
from memory.services.user_memory.extraction import session_memories_extract

pytestmark = pytest.mark.django_db


def talk(api: Any, *lines: str, user_id: str = "u1") -> str:
    created = api.post("/api/v1/sessions", {"agent": "bot", "user_id": user_id}, format="json")
    assert created.status_code == 201, created.content
    sid = str(created.json()["id"])
    body = {"messages": [{"role": "user", "content": line} for line in lines]}
    assert api.post(f"/api/v1/sessions/{sid}/messages", body, format="json").status_code == 201
    session_memories_extract(session=Session.objects.get(public_id=sid))
    return sid


def memory_of(subject: str) -> UserMemory:
    return UserMemory.objects.get(subject=subject, valid_to__isnull=True)


def test_deleting_a_session_takes_the_memories_taken_from_it_alone(api_a, tenant_a) -> None:
    first = talk(api_a, "I prefer tea in the morning.", "I live in Portland.")
    second = talk(api_a, "I live in Portland.")
    assert memory_of("preference.tea").sources == [{"session": first, "seq": 1}]
    city = memory_of("home.city")
    assert {s["session"] for s in city.sources} == {first, second}
    user_memories_embed(tenant_id=tenant_a.pk)
    tea = memory_of("preference.tea")
    assert tea.embedding is not None
    cached_as = text_hash(tea.text)  # the hash of the text as embedded
    assert EmbeddingCache.objects.filter(tenant=tenant_a, text_hash=cached_as).exists()

    response = api_a.delete(f"/api/v1/sessions/{first}")
    assert response.status_code == 204, response.content
    assert not UserMemory.objects.filter(subject="preference.tea").exists()
    assert not EmbeddingCache.objects.filter(tenant=tenant_a, text_hash=cached_as).exists()
    city = memory_of("home.city")
    assert city.sources == [{"session": second, "seq": 1}]  # other sources: kept, without the deleted one
    listed = api_a.get("/api/v1/users/u1/memories").json()["items"]
    assert {item["subject"] for item in listed} == {"home.city"}
    found = api_a.post(
        "/api/v1/memory/search", {"query": "tea morning", "kinds": ["user_memory"]}, format="json"
    )
    assert found.status_code == 200 and found.json()["results"] == [], found.content


def test_deleting_a_session_tombstones_its_events_like_forgetting_a_user(api_a) -> None:
    sid = talk(api_a, "I prefer tea in the morning.")
    event = api_a.post(
        "/api/v1/agents/bot/events",
        {"type": "agent.note", "session": sid, "payload": {"text": "tea secret"}},
        format="json",
    )
    assert event.status_code == 201, event.content
    assert api_a.delete(f"/api/v1/sessions/{sid}").status_code == 204
    note = Event.objects.get(type="agent.note")
    assert note.payload.get("erased") is True and "tea secret" not in str(note.payload)
    deleted = Event.objects.get(type="session.deleted")
    assert deleted.payload["counts"]["user_memories"] == 1 and "erased" not in deleted.payload


def test_an_experience_from_the_session_alone_goes_one_with_other_sources_stays(api_a) -> None:
    sid = talk(api_a, "Hello there.")
    other = talk(api_a, "Hello again.")
    promoted = api_a.post(
        "/api/v1/experiences/promote",
        {"kind": "preference", "key": "drink", "content": "tea", "user_id": "u1", "session": sid},
        format="json",
    ).json()["id"]
    again = {"kind": "preference", "key": "drink", "content": "tea", "user_id": "u1", "session": other}
    shared = api_a.post("/api/v1/experiences/promote", {**again, "key": "food"}, format="json").json()["id"]
    api_a.post("/api/v1/experiences/promote", {**again, "key": "food", "session": sid}, format="json")
    assert api_a.delete(f"/api/v1/sessions/{sid}").status_code == 204
    assert not Experience.objects.filter(public_id=promoted).exists()
    kept = Experience.objects.get(public_id=shared)
    assert [p.get("session") for p in kept.provenance] == [other]


def test_the_embedding_cache_is_per_tenant(tenant_a, tenant_b, monkeypatch) -> None:
    embedder = embedding.embedder_get()
    seen: list[str] = []
    original = type(embedder).embed

    def counted(self: Any, texts: list[str]) -> np.ndarray:
        seen.extend(texts)
        return original(self, texts)

    monkeypatch.setattr(type(embedder), "embed", counted)
    text = "The launch code word is Zebraquartz."
    key_a, key_b = (tenant_a.pk, text_hash(text)), (tenant_b.pk, text_hash(text))
    vectors_cached({key_a: text})
    vectors_cached({key_a: text})
    assert seen == [text]  # a tenant's own hit
    vectors_cached({key_b: text})
    assert seen == [text, text]  # another tenant's row is no hit: nothing tells B that A embedded it
    assert EmbeddingCache.objects.filter(text_hash=text_hash(text)).count() == 2


def test_forgetting_a_user_leaves_another_tenants_cache_rows(api_a, tenant_a, tenant_b, make_client) -> None:
    text = "Prefers jasmine tea after dinner"
    api_a.post("/api/v1/sessions", {"agent": "bot", "user_id": "u1"}, format="json")
    assert (
        api_a.post("/api/v1/users/u1/memories", {"subject": "drink", "text": text}, format="json").status_code
        == 201
    )
    user_memories_embed(tenant_id=tenant_a.pk)
    # Tenant B searches its own store item of the same text: B's cosine comes through the cache.
    api_b = make_client(tenant_b)
    put = {"op": "put", "namespace": ["notes"], "key": "k", "value": {"t": 1}, "texts": [text]}
    assert api_b.post("/api/v1/store/batch", {"ops": [put]}, format="json").status_code == 200
    found = api_b.post(
        "/api/v1/store/batch", {"ops": [{"op": "search", "query": "jasmine tea"}]}, format="json"
    )
    assert found.status_code == 200 and found.json()["results"][0][0]["score"] is not None, found.content
    b_rows = set(EmbeddingCache.objects.filter(tenant=tenant_b).values_list("text_hash", flat=True))
    assert text_hash(text) in b_rows

    forgot = make_client(tenant_a, ["admin"]).delete("/api/v1/users/u1")
    assert forgot.status_code == 200 and forgot.json()["counts"]["embedding_cache"] >= 1, forgot.content
    assert not EmbeddingCache.objects.filter(tenant=tenant_a, text_hash=text_hash(text)).exists()
    assert set(EmbeddingCache.objects.filter(tenant=tenant_b).values_list("text_hash", flat=True)) == b_rows
