"""Experiences stop hiding information, through real HTTP and the real model:
bulk create, delete, merge: false, agent filter, capacity through the API, and the merge rule
(only near-identical texts merge, and the merged text stays findable). Bob never sees Alice's."""

from __future__ import annotations

import pytest

from memory.models import Event, Experience, ExperiencePolicy
from memory.services import experiences as service
from memory.services.experiences import experiences_embed

pytestmark = pytest.mark.django_db

CRASH = {
    "problem": "Pod stuck in CrashLoopBackOff after deploy",
    "solution": "The DATABASE_URL environment variable was missing from the ConfigMap; added it",
}
# Near-identical: two words differ ("env", "in"); MiniLM cosine 0.995, word overlap 0.84.
CRASH_NEAR = {
    "problem": "Pod stuck in CrashLoopBackOff after deploy",
    "solution": "The DATABASE_URL env variable was missing in the ConfigMap; added it",
}
# A paraphrase (cosine 0.93): different words someone may search for; must stay its own row.
CRASH_PARAPHRASE = {
    "problem": "After deploying, the pod keeps crash-looping (CrashLoopBackOff)",
    "solution": "DATABASE_URL was not set in the ConfigMap, so we added it",
}


def items(n, **extra):
    return [{"problem": f"problem number {i}", "solution": f"fix number {i}", **extra} for i in range(n)]


def embed_all(tenant):
    for pk in Experience.objects.filter(tenant=tenant).order_by("pk").values_list("pk", flat=True):
        experiences_embed(experience_ids=[pk])  # one by one: each is reconciled against the earlier


def text_search(client, query, **extra):
    response = client.post(
        "/api/v1/experiences/search", {"query": query, "sources": ["text"], **extra}, format="json"
    )
    assert response.status_code == 200, response.content
    return [hit["experience"]["id"] for hit in response.json()["results"]]


# --- bulk -------------------------------------------------------------------------------------


def test_bulk_create_stores_all_and_queues_their_embedding_in_one_coalesced_batch(api_a, tenant_a):
    from memory.models import JobIntent
    from memory.services import jobs

    response = api_a.post("/api/v1/experiences/bulk", {"items": items(130)}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["created"] == 130 and body["merged"] == 0 and len(body["results"]) == 130
    assert [r["problem"] for r in body["results"]][:2] == ["problem number 0", "problem number 1"]
    assert all(r["outcome"] == "created" and r["embedding"]["status"] == "pending" for r in body["results"])
    assert Experience.objects.filter(tenant=tenant_a).count() == 130
    # the whole call's embedding is recorded as 3 job intents of <= 64 rows, not 130 jobs
    intents = list(JobIntent.objects.filter(kind=jobs.EMBED))
    assert sorted(len(i.payload["ids"]) for i in intents) == [2, 64, 64]
    queued = sorted(pk for i in intents for pk in i.payload["ids"])
    assert queued == sorted(Experience.objects.filter(tenant=tenant_a).values_list("pk", flat=True))


def test_bulk_create_refuses_more_than_the_limit_with_a_clear_message(api_a, tenant_a):
    response = api_a.post("/api/v1/experiences/bulk", {"items": items(1001)}, format="json")
    assert response.status_code == 422
    error = response.json()["error"]
    assert "at most 1000" in error["message"] and error["details"]["limit"] == 1000
    assert not Experience.objects.exists()
    assert api_a.post("/api/v1/experiences/bulk", {"items": []}, format="json").status_code == 422


def test_bulk_create_is_all_or_nothing_and_names_each_bad_item(api_a, tenant_a):
    bad = items(3)
    bad[1] = {"solution": "no problem given"}
    bad[2]["confidence"] = 7
    response = api_a.post(
        "/api/v1/experiences/bulk", {"items": [*bad, {"problem": "p", "scope": "user"}]}, format="json"
    )
    assert response.status_code == 422
    fields = response.json()["error"]["details"]["fields"]
    assert set(fields) == {"items[1].problem", "items[2].confidence", "items[3].user_id"}
    response = api_a.post(
        "/api/v1/experiences/bulk", {"items": [items(1)[0], "not an object"]}, format="json"
    )
    assert response.status_code == 422
    assert list(response.json()["error"]["details"]["fields"]) == ["items[1].non_field_errors"]
    assert not Experience.objects.exists() and not Event.objects.filter(type="experience.created").exists()


def test_bulk_create_is_idempotent_with_a_key(api_a, tenant_a):
    headers = {"HTTP_IDEMPOTENCY_KEY": "bulk-1"}
    first = api_a.post("/api/v1/experiences/bulk", {"items": items(5)}, format="json", **headers)
    again = api_a.post("/api/v1/experiences/bulk", {"items": items(5)}, format="json", **headers)
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert Experience.objects.filter(tenant=tenant_a).count() == 5


def test_bulk_create_merges_exact_duplicates_unless_merge_is_false(api_a, tenant_a):
    body = api_a.post(
        "/api/v1/experiences/bulk", {"items": [CRASH, CRASH, {**CRASH, "merge": False}]}, format="json"
    ).json()
    assert [r["outcome"] for r in body["results"]] == ["created", "merged", "created"]
    assert body["results"][0]["id"] == body["results"][1]["id"] != body["results"][2]["id"]
    assert Experience.objects.filter(tenant=tenant_a).count() == 2


def test_bulk_create_with_another_tenants_task_is_404(api_a, api_b, tenant_a):
    from memory.services.sessions import task_create

    task = task_create(tenant=tenant_a, agent_external_id="bot", title="x")
    response = api_b.post(
        "/api/v1/experiences/bulk", {"items": items(2), "task": task.public_id}, format="json"
    )
    assert response.status_code == 404
    assert not Experience.objects.exists()


# --- merge: false, merge rule -----------------------------------------------------------------


def test_merge_false_stores_a_new_row_even_for_an_exact_duplicate(api_a, tenant_a):
    first = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    second = api_a.post("/api/v1/experiences", {**CRASH, "merge": False}, format="json")
    assert second.status_code == 201 and second.json()["outcome"] == "created"
    assert second.json()["id"] != first["id"]
    embed_all(tenant_a)  # and it does not merge later, when embedded (cosine 1.0)
    listed = api_a.get("/api/v1/experiences").json()["results"]
    assert {r["id"] for r in listed} == {first["id"], second.json()["id"]}


def test_a_paraphrase_no_longer_merges_both_stay_visible(api_a, tenant_a):
    first = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    second = api_a.post("/api/v1/experiences", CRASH_PARAPHRASE, format="json").json()
    embed_all(tenant_a)
    listed = {r["id"] for r in api_a.get("/api/v1/experiences").json()["results"]}
    assert listed == {first["id"], second["id"]}
    assert not Event.objects.filter(tenant=tenant_a, type="experience.merged").exists()


def test_a_near_identical_text_merges_and_its_own_words_stay_findable(api_a, tenant_a):
    first = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    second = api_a.post("/api/v1/experiences", CRASH_NEAR, format="json").json()
    # before embedding: each is found by its own wording
    assert text_search(api_a, "env") == [second["id"]]
    embed_all(tenant_a)
    merged = api_a.get(f"/api/v1/experiences/{second['id']}").json()
    assert merged["merged_into"] == first["id"] and merged["active"] is False
    canonical = api_a.get(f"/api/v1/experiences/{first['id']}").json()
    assert canonical["merged_from"] == [second["id"]]
    assert canonical["aliases"] == [f"Problem: {CRASH_NEAR['problem']} Solution: {CRASH_NEAR['solution']}"]
    # "env" is only in the merged duplicate's text: full text still finds it, through the canonical row
    assert text_search(api_a, "env") == [first["id"]]
    # and by meaning too: the canonical row is near-identical to the duplicate's text
    hits = api_a.post(
        "/api/v1/experiences/search",
        {
            "query": Experience.compose_text(CRASH_NEAR["problem"], "", CRASH_NEAR["solution"]),
            "sources": ["vector"],
        },
        format="json",
    ).json()["results"]
    assert hits[0]["experience"]["id"] == first["id"] and hits[0]["similarity"] > 0.75


def test_the_merge_rule_is_a_tenant_policy(api_a, tenant_a):
    policy = ExperiencePolicy.for_tenant(tenant_a)
    policy.merge_threshold, policy.merge_token_overlap = 0.9, 0.4
    policy.save()
    first = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    second = api_a.post("/api/v1/experiences", CRASH_PARAPHRASE, format="json").json()
    embed_all(tenant_a)
    assert Experience.objects.get(public_id=second["id"]).merged_into.public_id == first["id"]
    assert text_search(api_a, "crash-looping") == [first["id"]]


# --- delete ------------------------------------------------------------------------------------


def test_delete_removes_it_records_an_event_and_another_tenant_gets_404(api_a, api_b, tenant_a):
    exp = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    assert api_b.delete(f"/api/v1/experiences/{exp['id']}").status_code == 404
    assert api_a.delete("/api/v1/experiences/exp_000000000000000000000000").status_code == 404
    response = api_a.delete(f"/api/v1/experiences/{exp['id']}")
    assert response.status_code == 204 and not response.content
    assert api_a.get(f"/api/v1/experiences/{exp['id']}").status_code == 404
    assert text_search(api_a, "CrashLoopBackOff") == []
    event = Event.objects.get(tenant=tenant_a, type="experience.deleted")
    assert event.payload["experience"] == exp["id"]
    assert api_a.delete(f"/api/v1/experiences/{exp['id']}").status_code == 404


def test_deleting_a_replacement_brings_back_what_it_superseded(api_a, tenant_a):
    old = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    new = api_a.post(
        "/api/v1/experiences",
        {
            "problem": CRASH["problem"],
            "solution": "Raise the liveness probe timeout",
            "supersedes": old["id"],
        },
        format="json",
    ).json()
    assert {r["id"] for r in api_a.get("/api/v1/experiences").json()["results"]} == {new["id"]}
    assert api_a.delete(f"/api/v1/experiences/{new['id']}").status_code == 204
    restored = api_a.get(f"/api/v1/experiences/{old['id']}").json()
    assert restored["active"] is True and restored["superseded_by"] is None
    assert Event.objects.get(type="experience.deleted").payload["restored"] == [old["id"]]


def test_delete_with_a_read_only_key_is_refused(make_client, tenant_a, api_a):
    exp = api_a.post("/api/v1/experiences", CRASH, format="json").json()
    reader = make_client(tenant_a, ["read"])
    assert reader.delete(f"/api/v1/experiences/{exp['id']}").status_code == 403
    assert Experience.objects.filter(public_id=exp["id"]).exists()


# --- agent filter ------------------------------------------------------------------------------


def test_agent_is_recorded_and_filters_list_and_search(api_a, api_b, tenant_a):
    planner = api_a.post("/api/v1/experiences", {**CRASH, "agent": "planner"}, format="json").json()
    coder = api_a.post(
        "/api/v1/experiences/bulk", {"items": [{**CRASH, "agent": "coder"}]}, format="json"
    ).json()["results"][0]
    assert planner["agent"] == "planner" and coder["agent"] == "coder"
    assert coder["outcome"] == "created"  # the same text from another agent is its own memory
    listed = api_a.get("/api/v1/experiences?agent=coder").json()["results"]
    assert [r["id"] for r in listed] == [coder["id"]]
    assert text_search(api_a, "CrashLoopBackOff", agent="planner") == [planner["id"]]
    assert sorted(text_search(api_a, "CrashLoopBackOff")) == sorted([planner["id"], coder["id"]])
    assert api_b.get("/api/v1/experiences?agent=coder").json()["results"] == []
    assert text_search(api_b, "CrashLoopBackOff", agent="planner") == []


def test_a_key_bound_to_an_agent_records_that_agent_and_cannot_name_another(make_client, tenant_a):
    from rest_framework.test import APIClient

    from memory.services.tenancy import api_key_create

    _, secret = api_key_create(tenant=tenant_a, name="bound", agent_external_id="planner")
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    created = bound.post("/api/v1/experiences", CRASH, format="json").json()
    assert created["agent"] == "planner"
    response = bound.post("/api/v1/experiences/bulk", {"items": [{**CRASH, "agent": "coder"}]}, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "agent_mismatch"


# --- capacity through the API ------------------------------------------------------------------


def test_capacity_is_settable_per_tenant_through_the_api(make_client, tenant_a, tenant_b, api_a):
    admin_a, admin_b = make_client(tenant_a, ["admin"]), make_client(tenant_b, ["admin"])
    assert api_a.get("/api/v1/tenant/policies/experiences").status_code == 403  # admin scope only
    assert admin_a.get("/api/v1/tenant/policies/experiences").json()["capacity"] == 5000
    response = admin_a.patch("/api/v1/tenant/policies/experiences", {"capacity": 3}, format="json")
    assert response.status_code == 200 and response.json()["capacity"] == 3
    assert response.json()["merge_threshold"] == 0.97  # untouched fields keep their value
    assert ExperiencePolicy.for_tenant(tenant_a).capacity == 3
    assert ExperiencePolicy.for_tenant(tenant_b).capacity == 5000  # Bob's is his own
    assert admin_b.get("/api/v1/tenant/policies/experiences").json()["capacity"] == 5000
    event = Event.objects.get(tenant=tenant_a, type="policy.updated")
    assert event.payload["before"] == {"capacity": 5000} and event.payload["after"] == {"capacity": 3}
    # and eviction honours it
    api_a.post("/api/v1/experiences/bulk", {"items": items(5)}, format="json")
    assert service.experiences_evict(tenant=tenant_a) == 2
    assert Experience.objects.filter(tenant=tenant_a).count() == 3


def test_policy_update_validates_its_input(make_client, tenant_a):
    admin = make_client(tenant_a, ["admin"])
    for body, field in [
        ({"capacity": 0}, "capacity"),
        ({"merge_threshold": 1.5}, "merge_threshold"),
        ({"capacity": "many"}, "capacity"),
        ({"nope": 1}, "nope"),
    ]:
        response = admin.patch("/api/v1/tenant/policies/experiences", body, format="json")
        assert response.status_code == 422, body
        assert field in response.json()["error"]["details"]["fields"]
    assert ExperiencePolicy.for_tenant(tenant_a).capacity == 5000


# --- Python client (sync in-process, async over a live server) ---------------------------------


def test_the_client_bulk_creates_filters_deletes_and_reads_the_digest(alice, tenant_a, make_client):
    from ctxapp import client as ctx
    from memory.services.session_digest import session_digest_update
    from memory.services.sessions import MessageInput, messages_append, session_create

    bulk = alice.experiences_create_bulk([{**CRASH, "agent": "planner"}, {**CRASH, "merge": False}])
    assert bulk["created"] == 2 and [r["agent"] for r in bulk["results"]] == ["planner", ""]
    assert [r["id"] for r in alice.experiences_list(agent="planner")["results"]] == [bulk["results"][0]["id"]]
    found = alice.experiences_search("CrashLoopBackOff", sources=["text"], agent="planner")
    assert [h["experience"]["id"] for h in found["results"]] == [bulk["results"][0]["id"]]
    single = alice.experience_create(CRASH["problem"], solution=CRASH["solution"], merge=False, agent="x")
    assert single["outcome"] == "created" and single["agent"] == "x"
    assert alice.experience_delete(single["id"]) is None
    with pytest.raises(ctx.NotFound):
        alice.experience_get(single["id"])
    with pytest.raises(ctx.Forbidden):  # a read/write key is not an admin key
        alice.experience_policy_get()
    session = session_create(tenant=tenant_a, agent_external_id="planner", user_id="ana")
    with pytest.raises(ctx.NotFound):
        alice.session_digest(session.public_id)
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[MessageInput(role="user", content="I want to ship v2 by May.")],
    )
    session_digest_update(tenant=tenant_a, session=session)
    digest = alice.session_digest(session.public_id)
    assert digest["version"] == 1 and digest["goals"][0]["text"] == "I want to ship v2 by May."
    assert [d["version"] for d in alice.session_digests(session.public_id)["results"]] == [1]
    assert alice.session_digest_refresh(session.public_id)["queued"] is True


@pytest.mark.django_db(transaction=True)
def test_the_async_client_covers_the_new_endpoints(live_server):
    import asyncio

    from ctxapp import client as ctx
    from memory.models import Tenant
    from memory.services.tenancy import api_key_create

    tenant = Tenant.objects.create(name="Async", slug="async")
    _, secret = api_key_create(tenant=tenant, name="admin", scopes=["admin"])

    async def scenario():
        async with ctx.AsyncClient(live_server.url, secret) as api:
            bulk = await api.experiences_create_bulk(items(3, agent="coder"))
            first = bulk["results"][0]["id"]
            listed = await api.experiences_list(agent="coder")
            hits = await api.experiences_search("number", sources=["text"], agent="coder")
            await api.experience_delete(first)
            policy = await api.experience_policy_update(capacity=42)
            again = await api.experience_policy_get()
            created = await api.experience_create("p", merge=False, agent="coder")
            return bulk, listed, hits, policy, again, created

    bulk, listed, hits, policy, again, created = asyncio.run(scenario())
    assert bulk["created"] == 3 and len(listed["results"]) == 3 and len(hits["results"]) == 3
    assert not Experience.objects.filter(public_id=bulk["results"][0]["id"]).exists()
    assert policy["capacity"] == again["capacity"] == 42 == ExperiencePolicy.for_tenant(tenant).capacity
    assert created["agent"] == "coder"

    from memory.services.session_digest import session_digest_update
    from memory.services.sessions import MessageInput, messages_append, session_create

    session = session_create(tenant=tenant, agent_external_id="coder", user_id="ana")
    messages_append(
        tenant=tenant, session=session, items=[MessageInput(role="user", content="I want to ship v2 by May.")]
    )
    session_digest_update(tenant=tenant, session=session)

    async def digests():
        async with ctx.AsyncClient(live_server.url, secret) as api:
            latest = await api.session_digest(session.public_id)
            first = await api.session_digest(session.public_id, version=1)
            page = await api.session_digests(session.public_id)
            queued = await api.session_digest_refresh(session.public_id)
            return latest, first, page, queued

    latest, first, page, queued = asyncio.run(digests())
    assert latest == first and latest["goals"][0]["text"] == "I want to ship v2 by May."
    assert [d["version"] for d in page["results"]] == [1] and queued["queued"] is True
