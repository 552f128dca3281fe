"""Experiences API through real HTTP: list, create, read, search, feedback, promote, retry, distill.
Bob must never see or change Alice's experiences or tasks."""

from __future__ import annotations

import pytest

from memory.models import Event, Experience, ExperienceFeedback, Task
from memory.services.experiences import experiences_embed, experiences_mark_failed
from memory.services.sessions import session_create, task_create, task_update

pytestmark = pytest.mark.django_db

CRASH = {
    "problem": "Pod stuck in CrashLoopBackOff after deploy",
    "solution": "The DATABASE_URL environment variable was missing from the ConfigMap; added it",
    "confidence": 0.7,
}
NGINX = {
    "problem": "Nginx returns 502 Bad Gateway",
    "solution": "bind the upstream app to 0.0.0.0, not 127.0.0.1",
}


def create(client, body=CRASH):
    response = client.post("/api/v1/experiences", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def embed_all(tenant):
    experiences_embed(
        experience_ids=list(Experience.objects.filter(tenant=tenant).values_list("pk", flat=True))
    )


def test_create_then_read_with_provenance_and_pending_embedding(api_a, tenant_a):
    body = create(api_a)
    assert body["id"].startswith("exp_") and body["outcome"] == "created"
    assert body["embedding"]["status"] == "pending" and body["extraction_method"] == "manual"
    read = api_a.get(f"/api/v1/experiences/{body['id']}").json()
    assert read["problem"] == CRASH["problem"]
    assert read["provenance"][0]["method"] == "manual"
    assert read["merged_from"] == [] and read["supersedes"] == [] and read["superseded_by"] is None
    assert Event.objects.filter(
        tenant=tenant_a, type="experience.created", payload__experience=body["id"]
    ).exists()


def test_an_exact_duplicate_answers_200_merged(api_a, tenant_a):
    first = create(api_a)
    response = api_a.post("/api/v1/experiences", CRASH, format="json")
    assert response.status_code == 200 and response.json()["outcome"] == "merged"
    assert response.json()["id"] == first["id"] and response.json()["confidence"] > 0.7
    assert Experience.objects.filter(tenant=tenant_a).count() == 1


def test_create_validates_fields(api_a, tenant_a):
    response = api_a.post("/api/v1/experiences", {"solution": "x", "confidence": 2}, format="json")
    assert response.status_code == 422
    assert set(response.json()["error"]["details"]["fields"]) == {"problem", "confidence"}
    response = api_a.post("/api/v1/experiences", {"problem": "p", "scope": "user"}, format="json")
    assert response.status_code == 422 and "user_id" in response.json()["error"]["details"]["fields"]
    assert not Experience.objects.exists()


def test_list_pages_and_filters(api_a, tenant_a):
    ids = [create(api_a, {"problem": f"problem {i}", "solution": f"solution {i}"})["id"] for i in range(3)]
    page = api_a.get("/api/v1/experiences?limit=2").json()
    assert [r["id"] for r in page["results"]] == ids[::-1][:2] and page["next_cursor"]
    rest = api_a.get(f"/api/v1/experiences?limit=2&cursor={page['next_cursor']}").json()
    assert [r["id"] for r in rest["results"]] == [ids[0]] and rest["next_cursor"] is None
    assert api_a.get("/api/v1/experiences?embedding_status=completed").json()["results"] == []
    # The one list envelope {items, next}; `results` / `next_cursor` stay as deprecated aliases.
    assert page["items"] == page["results"] and page["next"] == page["next_cursor"]
    following = api_a.get(f"/api/v1/experiences?limit=2&cursor={page['next']}").json()
    assert [r["id"] for r in following["items"]] == [ids[0]] and following["next"] is None


def test_search_returns_scores_and_each_signal(api_a, tenant_a):
    crash, nginx = create(api_a), create(api_a, NGINX)
    embed_all(tenant_a)
    response = api_a.post(
        "/api/v1/experiences/search",
        {"query": "my container keeps restarting after the release"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["plan"] == {
        "sources": ["vector", "text"],
        "weights": {"vector": 1.0, "text": 0.1},
        "fusion": "zscore",
    }
    top = body["results"][0]
    assert top["experience"]["id"] == crash["id"]
    assert set(top["contributions"]) == {"vector", "text"}
    assert top["score"] == pytest.approx(sum(top["contributions"].values()), abs=1e-5)
    assert top["similarity"] > 0.3
    text_only = api_a.post(
        "/api/v1/experiences/search", {"query": "502 Bad Gateway", "sources": ["text"]}, format="json"
    ).json()
    assert [r["experience"]["id"] for r in text_only["results"]] == [nginx["id"]]
    assert set(text_only["results"][0]["contributions"]) == {"text"}


def test_search_validates_the_plan(api_a):
    response = api_a.post("/api/v1/experiences/search", {"query": "x", "sources": ["graph"]}, format="json")
    assert response.status_code == 422 and "sources" in response.json()["error"]["details"]["fields"]
    response = api_a.post(
        "/api/v1/experiences/search", {"query": "x", "weights": {"vector": -1}}, format="json"
    )
    assert response.status_code == 422


def test_search_with_a_read_only_key(make_client, tenant_a, api_a):
    create(api_a)
    reader = make_client(tenant_a, ["read"])
    assert (
        reader.post("/api/v1/experiences/search", {"query": "CrashLoopBackOff"}, format="json").status_code
        == 200
    )
    assert reader.post("/api/v1/experiences", CRASH, format="json").status_code == 403


def test_supersede_through_the_api_and_history(api_a, tenant_a):
    old = create(api_a)
    new = create(api_a, {**CRASH, "solution": "Use a Secret for DATABASE_URL", "supersedes": old["id"]})
    read_old = api_a.get(f"/api/v1/experiences/{old['id']}").json()
    assert read_old["superseded_by"] == new["id"] and read_old["active"] is False
    assert api_a.get(f"/api/v1/experiences/{new['id']}").json()["supersedes"] == [old["id"]]
    listed = [r["id"] for r in api_a.get("/api/v1/experiences").json()["results"]]
    assert listed == [new["id"]]
    listed = [r["id"] for r in api_a.get("/api/v1/experiences?include_superseded=true").json()["results"]]
    assert listed == [new["id"], old["id"]]
    as_of = read_old["created_at"]
    found = api_a.post(
        "/api/v1/experiences/search",
        {"query": "CrashLoopBackOff", "as_of": as_of, "sources": ["text"]},
        format="json",
    ).json()
    assert [r["experience"]["id"] for r in found["results"]] == [old["id"]]


def test_feedback_counts(api_a, tenant_a):
    body = create(api_a)
    response = api_a.post(f"/api/v1/experiences/{body['id']}/feedback", {"helpful": True}, format="json")
    assert response.status_code == 200 and response.json()["helpful_count"] == 1
    assert ExperienceFeedback.objects.filter(experience__public_id=body["id"], helpful=True).count() == 1
    assert api_a.post(f"/api/v1/experiences/{body['id']}/feedback", {}, format="json").status_code == 422


def test_promote(api_a, tenant_a):
    body = {"kind": "preference", "key": "language", "content": "Answer in French", "user_id": "u1"}
    response = api_a.post("/api/v1/experiences/promote", body, format="json")
    assert response.status_code == 201, response.content
    promoted = response.json()
    assert (promoted["scope"], promoted["user_id"], promoted["kind"]) == ("user", "u1", "preference")
    again = api_a.post("/api/v1/experiences/promote", body, format="json")
    assert again.status_code == 200 and again.json()["outcome"] == "unchanged"
    bad = api_a.post("/api/v1/experiences/promote", {**body, "kind": "experience"}, format="json")
    assert bad.status_code == 422 and "kind" in bad.json()["error"]["details"]["fields"]


def test_retry_failed_embeddings(api_a, tenant_a):
    body = create(api_a)
    experiences_mark_failed(
        experience_ids=[Experience.objects.get(public_id=body["id"]).pk], reason="HTTP 500"
    )
    assert api_a.get(f"/api/v1/experiences/{body['id']}").json()["embedding"]["error"] == "HTTP 500"
    response = api_a.post("/api/v1/experiences/embeddings/retry", {}, format="json")
    assert response.status_code == 202 and response.json() == {"requeued": 1}
    assert api_a.get(f"/api/v1/experiences/{body['id']}").json()["embedding"]["status"] == "pending"


def finished_task(tenant, status="succeeded"):
    session = session_create(tenant=tenant, agent_external_id="agent-1", user_id="u1")
    task = task_create(
        tenant=tenant, session=session, input="Pod stuck in CrashLoopBackOff", metadata={"distill": "none"}
    )
    return task_update(tenant=tenant, task=task, status=status, output="Added DATABASE_URL to the ConfigMap")


def test_distill_light_and_full(api_a, tenant_a):
    task = finished_task(tenant_a)
    response = api_a.post(f"/api/v1/tasks/{task.public_id}/distill", {"mode": "light"}, format="json")
    assert response.status_code == 200, response.content
    [item] = response.json()["experiences"]
    assert item["extraction_method"] == "direct" and item["source_task"] == task.public_id
    again = api_a.post(f"/api/v1/tasks/{task.public_id}/distill", {"mode": "light"}, format="json").json()
    assert again["experiences"][0]["outcome"] == "unchanged"
    full = api_a.post(f"/api/v1/tasks/{task.public_id}/distill", {}, format="json")
    assert full.status_code == 202 and full.json()["status"] == "queued"
    distilled = Event.objects.filter(tenant=tenant_a, type="memory.distilled", payload__task=task.public_id)
    assert [e.payload["path"] for e in distilled.order_by("pk")] == ["none", "light", "light"]


def test_distill_an_unfinished_task_is_409(api_a, tenant_a):
    task = task_create(tenant=tenant_a, input="still running")
    response = api_a.post(f"/api/v1/tasks/{task.public_id}/distill", {"mode": "light"}, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "task_not_finished"
    assert not Experience.objects.exists()


def test_bob_cannot_reach_alices_experiences_or_tasks(api_a, api_b, tenant_a, tenant_b):
    alice = create(api_a)
    embed_all(tenant_a)
    task = finished_task(tenant_a)
    before = Experience.objects.get(public_id=alice["id"])
    exp_url = f"/api/v1/experiences/{alice['id']}"
    assert api_b.get(exp_url).status_code == 404
    assert api_b.post(f"{exp_url}/feedback", {"helpful": True}, format="json").status_code == 404
    assert (
        api_b.post(f"/api/v1/tasks/{task.public_id}/distill", {"mode": "light"}, format="json").status_code
        == 404
    )
    assert (
        api_b.post("/api/v1/experiences", {**CRASH, "supersedes": alice["id"]}, format="json").status_code
        == 404
    )
    assert (
        api_b.post("/api/v1/experiences", {**CRASH, "task": task.public_id}, format="json").status_code == 404
    )
    assert api_b.get("/api/v1/experiences").json()["results"] == []
    search = api_b.post("/api/v1/experiences/search", {"query": "CrashLoopBackOff pod"}, format="json").json()
    assert search["results"] == []
    Experience.objects.filter(pk=before.pk).update(embedding_status="failed", embedding_error="x")
    assert api_b.post("/api/v1/experiences/embeddings/retry", {}, format="json").json() == {"requeued": 0}
    promoted = api_b.post(
        "/api/v1/experiences/promote", {"kind": "constraint", "key": "k", "content": "c"}, format="json"
    )
    assert promoted.status_code == 201 and promoted.json()["id"] != alice["id"]
    after = Experience.objects.get(public_id=alice["id"])
    assert (after.helpful_count, after.superseded_by_id, after.embedding_status) == (0, None, "failed")
    assert not Experience.objects.filter(tenant=tenant_b, source_task=task).exists()
    assert not Task.objects.filter(tenant=tenant_b).exists()
    assert api_a.get("/api/v1/experiences").json()["results"][0]["id"] == alice["id"]
