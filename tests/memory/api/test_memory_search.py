"""POST /api/v1/memory/search over HTTP: real PostgreSQL, the real embedding model.

Alice's memory is never Bob's; another agent's private layer never appears.
"""

from __future__ import annotations

from typing import Any

import pytest

from memory.models import Agent, PrivateContext, Task
from memory.services import message_indexing

pytestmark = pytest.mark.django_db

SEARCH = "/api/v1/memory/search"


def create_session(api: Any, agent: str = "bot", user_id: str = "u1") -> str:
    response = api.post("/api/v1/sessions", {"agent": agent, "user_id": user_id}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def append(api: Any, session_id: str, messages: list[dict[str, Any]]) -> None:
    response = api.post(f"/api/v1/sessions/{session_id}/messages", {"messages": messages}, format="json")
    assert response.status_code == 201, response.content


def search(api: Any, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    response = api.post(SEARCH, body, format="json")
    assert response.status_code == status, response.content
    return response.json()


@pytest.fixture
def history(api_a: Any) -> dict[str, str]:
    """Alice's user u1 talked to `bot` in two sessions, months apart; u2 in another."""
    first = create_session(api_a, user_id="u1")
    append(
        api_a,
        first,
        [
            {"role": "user", "name": "Caroline",
             "content": "I adopted a golden retriever puppy named Biscuit.",
             "occurred_at": "2023-05-08T13:56:00Z"},
            {"role": "assistant", "name": "Bot", "content": "Congratulations! How old is Biscuit?",
             "occurred_at": "2023-05-08T13:57:00Z"},
            {"role": "user", "name": "Caroline", "content": "Ten weeks. He chews everything.",
             "occurred_at": "2023-05-08T13:58:00Z"},
            {"role": "user", "name": "Caroline", "content": "Also I started learning the violin.",
             "occurred_at": "2023-05-08T14:10:00Z"},
        ],
    )  # fmt: skip
    second = create_session(api_a, user_id="u1")
    append(
        api_a,
        second,
        [
            {"role": "user", "name": "Caroline", "content": "Work has been busy with the quarterly report.",
             "occurred_at": "2023-09-01T09:00:00Z"},
            {"role": "assistant", "name": "Bot", "content": "Good luck with the report.",
             "occurred_at": "2023-09-01T09:01:00Z"},
        ],
    )  # fmt: skip
    other_user = create_session(api_a, user_id="u2")
    append(api_a, other_user, [{"role": "user", "content": "My cat is called Biscuit too, a grey kitten."}])
    message_indexing.memory_index_drain()
    return {"first": first, "second": second, "other_user": other_user}


def test_it_finds_an_old_message_by_meaning_across_the_users_sessions(api_a, history):
    body = search(
        api_a,
        {
            "query": "What is the name of Caroline's dog?",
            "scope": {"user_id": "u1", "sessions": "all"},
            "limit": 3,
        },
    )
    top = body["results"][0]
    assert top["kind"] == "message"
    assert top["session"] == history["first"] and top["seq"] == 1
    assert top["id"] == f"{history['first']}:1"
    assert top["speaker"] == "Caroline"
    assert top["occurred_at"].startswith("2023-05-08T13:56")
    assert "golden retriever" in top["text"]
    assert {"dense", "lexical", "neighbour", "recency"} <= set(top["contributions"])
    assert abs(sum(top["contributions"].values()) - top["score"]) < 1e-4
    assert all(hit["session"] != history["other_user"] for hit in body["results"])


def test_the_current_session_only(api_a, history):
    body = search(
        api_a,
        {"query": "dog puppy", "scope": {"session": history["second"], "sessions": "current"}, "limit": 10},
    )
    assert {hit["session"] for hit in body["results"]} <= {history["second"]}


def test_a_session_scope_with_all_covers_its_users_other_sessions(api_a, history):
    body = search(api_a, {"query": "violin", "scope": {"session": history["second"]}, "limit": 3})
    assert body["results"][0]["session"] == history["first"] and body["results"][0]["seq"] == 4


def test_time_range_filters_by_occurred_at(api_a, history):
    body = search(
        api_a,
        {"query": "report puppy violin", "scope": {"user_id": "u1"}, "kinds": ["message"],
         "time_range": {"from": "2023-08-01T00:00:00Z"}, "limit": 10},
    )  # fmt: skip
    assert body["results"] and {hit["session"] for hit in body["results"]} == {history["second"]}


def test_neighbours_come_with_each_message_hit_on_request(api_a, history):
    body = search(api_a, {"query": "violin", "scope": {"user_id": "u1"}, "limit": 1, "neighbours": 2})
    hit = body["results"][0]
    assert [n["seq"] for n in hit["neighbours"]] == [2, 3]
    assert hit["neighbours"][1]["text"] == "Ten weeks. He chews everything."
    assert "neighbours" not in search(api_a, {"query": "violin", "scope": {"user_id": "u1"}})["results"][0]


def test_a_plan_changes_the_ranking_and_is_echoed(api_a, history):
    body = search(
        api_a,
        {
            "query": "violin",
            "scope": {"user_id": "u1"},
            "plan": {"dense_weight": 0.0, "neighbour_weight": 0.0},
        },
    )
    assert body["plan"]["dense_weight"] == 0.0
    assert all(hit["contributions"]["dense"] == 0.0 for hit in body["results"])


def test_kinds_filter(api_a, history, tenant_a):
    from memory.services.experiences import experience_create

    experience_create(tenant=tenant_a, problem="violin strings keep snapping", solution="loosen the pegs")
    body = search(api_a, {"query": "violin", "scope": {"user_id": "u1"}, "kinds": ["experience"]})
    assert body["results"] and {hit["kind"] for hit in body["results"]} == {"experience"}
    body = search(api_a, {"query": "violin", "scope": {"user_id": "u1"}, "kinds": ["message"]})
    assert {hit["kind"] for hit in body["results"]} == {"message"}
    # Both kinds rank in one pool, on one score scale: the two violin texts lead, best first.
    both = search(api_a, {"query": "violin", "scope": {"user_id": "u1"}, "kinds": ["message", "experience"]})
    assert {hit["kind"] for hit in both["results"][:2]} == {"message", "experience"}
    assert all("violin" in hit["text"] for hit in both["results"][:2])
    scores = [hit["score"] for hit in both["results"]]
    assert scores == sorted(scores, reverse=True)


def test_summaries_and_facts_are_searchable(api_a, history, tenant_a):
    from memory.models import Session, Summary, TrackedFact

    session = Session.objects.get(public_id=history["first"])
    Summary.objects.create(
        tenant=tenant_a, session=session, text="Caroline plays the saxophone in a jazz band.",
        covers_up_to_seq=4, folded_from_seq=1, folded_to_seq=4, folded_count=4,
        tokens_before=50, tokens_after=10,
    )  # fmt: skip
    TrackedFact.objects.create(
        tenant=tenant_a, session=session, key="allergy", fact_type="constraint",
        content="Caroline is allergic to peanuts", importance="high",
    )  # fmt: skip
    kinds = {
        hit["kind"]: hit
        for hit in search(api_a, {"query": "saxophone jazz", "scope": {"user_id": "u1"}})["results"]
    }
    assert "summary" in kinds
    facts = search(api_a, {"query": "peanuts allergy", "scope": {"user_id": "u1"}, "kinds": ["fact"]})[
        "results"
    ]
    assert facts[0]["kind"] == "fact" and "peanuts" in facts[0]["text"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x", "kinds": ["message", "emails"]}, "kinds"),
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": 101}, "limit"),
        ({"query": "x", "plan": {"bogus_weight": 1}}, "plan.bogus_weight"),
        ({"query": "x", "plan": {"fusion": "magic"}}, "plan.fusion"),
        ({"query": "x", "neighbours": 6}, "neighbours"),
        ({"query": "x", "scope": {"sessions": "some"}}, "scope"),
    ],
)
def test_bad_input_is_422_naming_the_field(api_a, body, field):
    response = api_a.post(SEARCH, body, format="json")
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert any(name == field or name.startswith(field) for name in error["details"]["fields"]), error


def test_an_unknown_or_foreign_session_or_agent_is_404_alike(api_a, api_b, history):
    missing = search(api_b, {"query": "dog", "scope": {"session": "sess_" + "0" * 24}}, status=404)
    foreign = search(api_b, {"query": "dog", "scope": {"session": history["first"]}}, status=404)
    assert missing["error"]["code"] == foreign["error"]["code"] == "not_found"
    search(api_b, {"query": "dog", "scope": {"agent": "bot"}}, status=404)  # Alice's agent, not Bob's
    search(api_a, {"query": "dog", "scope": {"agent": "nobody"}}, status=404)


def test_another_tenants_messages_never_appear(api_a, api_b, history):
    bob = create_session(api_b, user_id="u1")
    append(api_b, bob, [{"role": "user", "content": "Bob's golden retriever is named Biscuit as well."}])
    message_indexing.memory_index_drain()
    for scope in ({"user_id": "u1"}, {}):
        results = search(api_b, {"query": "golden retriever Biscuit", "scope": scope, "limit": 100})[
            "results"
        ]
        assert results and {hit["session"] for hit in results} == {bob}
        results = search(api_a, {"query": "golden retriever Biscuit", "scope": scope, "limit": 100})[
            "results"
        ]
        assert bob not in {hit["session"] for hit in results}


def test_another_agents_private_layer_never_appears(api_a, tenant_a, history):
    other = Agent.objects.create(tenant=tenant_a, external_id="spy")
    task = Task.objects.create(tenant=tenant_a, agent=other, title="t")
    PrivateContext.objects.create(
        tenant=tenant_a,
        task=task,
        agent=other,
        document='{"note": "Biscuit the golden retriever secret plan"}',
    )
    results = search(api_a, {"query": "Biscuit secret plan", "limit": 100})["results"]
    assert results and all("secret plan" not in hit["text"] for hit in results)


def test_a_read_only_key_may_search(make_client, tenant_a, history):
    reader = make_client(tenant_a, scopes=["read"])
    assert search(reader, {"query": "violin", "scope": {"user_id": "u1"}})["results"]


def test_index_status_counts_messages_per_state(api_a, history):
    body = api_a.get("/api/v1/memory/index").json()
    assert body == {"pending": 0, "completed": 7, "failed": 0, "skipped": 0}


def test_a_key_bound_to_an_agent_searches_only_that_agents_memory(
    api_a: Any, history: dict[str, str], tenant_a: Any
) -> None:
    from rest_framework.test import APIClient

    from memory.services.tenancy import api_key_create

    _, secret = api_key_create(tenant=tenant_a, name="other bot", agent_external_id="other-bot")
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    create_session(bound, agent="other-bot")
    refused = search(bound, {"query": "golden retriever puppy", "scope": {"agent": "bot"}}, status=403)
    assert refused["error"]["code"] == "agent_mismatch"
    # Without an agent in the scope, the bound key's own (empty) memory is searched: nothing of bot's.
    assert search(bound, {"query": "golden retriever puppy"})["results"] == []
    assert search(api_a, {"query": "golden retriever puppy"})["results"]  # bot's memory has it


def test_a_search_costs_no_query_for_the_kinds_the_scope_holds_none_of(history, tenant_a):
    # The tenant has messages only: a search of every kind asks one statement which kinds exist,
    # and reads no summary, digest, fact, experience or user memory table beyond it.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memory.services import memory_search

    memory_search.memory_search(
        tenant=tenant_a, query="warm up", scope=memory_search.SearchScope(user_id="u1")
    )
    with CaptureQueriesContext(connection) as queries:
        found = memory_search.memory_search(
            tenant=tenant_a,
            query="What is the name of Caroline's dog?",
            scope=memory_search.SearchScope(user_id="u1"),
        )
    assert found.results and found.results[0].seq == 1
    statements = [q["sql"] for q in queries.captured_queries]
    others = ("summary", "digest", "trackedfact", "experience", "usermemory")
    assert len([sql for sql in statements if any(name in sql for name in others)]) == 1, statements
    assert len(statements) <= 4, statements  # the scope's sessions, the kinds, the message pool


def test_one_candidate_path_the_whole_tenant_and_a_user_alike(api_a, history):
    # Every scope is searched by PostgreSQL's indexes the same way: the tenant's scope finds the
    # user's turn as the user's scope does, and a user's scope never another user's messages.
    whole = search(api_a, {"query": "What is the name of Caroline's dog?", "limit": 3})
    user = search(
        api_a, {"query": "What is the name of Caroline's dog?", "scope": {"user_id": "u1"}, "limit": 3}
    )
    assert (whole["results"][0]["session"], whole["results"][0]["seq"]) == (history["first"], 1)
    assert [h["id"] for h in user["results"]][:1] == [whole["results"][0]["id"]]
    other = search(api_a, {"query": "violin", "scope": {"user_id": "u2"}, "kinds": ["message"]})
    assert {hit["session"] for hit in other["results"]} <= {history["other_user"]}


def test_a_bound_key_cannot_read_another_agents_session_as_the_current_one(
    api_a: Any, history: dict[str, str], tenant_a: Any
) -> None:
    from rest_framework.test import APIClient

    from memory.services.tenancy import api_key_create

    _, secret = api_key_create(tenant=tenant_a, name="other bot", agent_external_id="other-bot")
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    create_session(bound, agent="other-bot")
    body = {"query": "golden retriever", "scope": {"session": history["first"], "sessions": "current"}}
    refused = search(bound, body, status=403)
    assert refused["error"]["code"] == "agent_mismatch"
    assert refused["error"]["details"] == {"bound_agent": "other-bot", "requested_agent": "bot"}


def test_a_search_sees_vectors_drained_after_its_first_search(api_a):
    # Nothing of a scope is cached between searches: a drain after the first search shows at once.
    session = create_session(api_a, user_id="u9")
    append(
        api_a,
        session,
        [
            {"role": "user", "content": "I adopted a golden retriever puppy last week."},
            {"role": "user", "content": "The quarterly report is due on Friday."},
        ],
    )
    body = {
        "query": "my new dog", "scope": {"user_id": "u9"}, "kinds": ["message"], "limit": 2,
        "min_similarity": -1,  # no relevance floor: the unrelated turn is listed to compare with
    }  # fmt: skip
    before = search(api_a, body)
    assert all(hit["similarity"] is None for hit in before["results"])
    message_indexing.memory_index_drain()
    after = search(api_a, body)["results"]
    assert "golden retriever" in after[0]["text"]
    assert after[0]["similarity"] > after[1]["similarity"] + 0.1
    append(api_a, session, [{"role": "user", "content": "Our dog Biscuit loves the beach."}])
    message_indexing.memory_index_drain()
    newest = search(api_a, {**body, "limit": 3})["results"]
    assert any("Biscuit" in hit["text"] and hit["similarity"] is not None for hit in newest)


def test_scores_never_rise_down_a_list_of_all_kinds_mixed(api_a, history, tenant_a):
    from memory.models import Session, Summary, TrackedFact
    from memory.services.experiences import experience_create

    session = Session.objects.get(public_id=history["first"])
    Summary.objects.create(
        tenant=tenant_a, session=session, text="Caroline adopted a puppy and learns the violin.",
        covers_up_to_seq=4, folded_from_seq=1, folded_to_seq=4, folded_count=4,
        tokens_before=50, tokens_after=10,
    )  # fmt: skip
    TrackedFact.objects.create(
        tenant=tenant_a, session=session, key="pet", fact_type="preference",
        content="Caroline's puppy Biscuit is a golden retriever", importance="high",
    )  # fmt: skip
    experience_create(tenant=tenant_a, problem="a puppy chews everything", solution="give it chew toys")
    experience_create(tenant=tenant_a, problem="violin strings keep snapping", solution="loosen the pegs")
    for query, kinds in (
        ("puppy Biscuit violin", {"message", "experience"}),
        ("what does the puppy chew", {"message", "experience"}),
        ("quarterly report", {"message"}),
    ):
        results = search(api_a, {"query": query, "scope": {"user_id": "u1"}, "limit": 20})["results"]
        assert {hit["kind"] for hit in results} >= kinds, query
        scores = [hit["score"] for hit in results]
        assert scores == sorted(scores, reverse=True), (query, scores)


def test_a_users_own_experiences_are_found_and_no_one_elses(api_a, history, tenant_a):
    from memory.models import ExperienceScope
    from memory.services.experiences import experience_create

    experience_create(
        tenant=tenant_a,
        problem="violin rosin dust",
        solution="wipe the strings",
        scope=ExperienceScope.USER,
        user_id="u1",
    )
    experience_create(
        tenant=tenant_a,
        problem="violin bow hair loose",
        solution="rehair the bow",
        scope=ExperienceScope.USER,
        user_id="u2",
    )
    experience_create(tenant=tenant_a, problem="violin tuning drifts", solution="check the pegs")

    def found(scope: dict[str, Any]) -> set[str]:
        results = search(api_a, {"query": "violin", "scope": scope, "kinds": ["experience"]})["results"]
        return {hit["text"].split("\n")[0] for hit in results}

    assert found({"user_id": "u1"}) == {"Problem: violin rosin dust", "Problem: violin tuning drifts"}
    assert found({"user_id": "u2"}) == {"Problem: violin bow hair loose", "Problem: violin tuning drifts"}
    assert found({"agent": "bot"}) == {"Problem: violin tuning drifts"}  # on no user's behalf: shared only


def test_the_answer_is_the_shape_its_serializer_documents(api_a, history, tenant_a):
    # search_result_out builds the answer directly; it must equal what the serializer gives,
    # for every kind of hit, with neighbours and a plan of every field type.
    from memory.api.memory import SearchOutputSerializer, search_result_out
    from memory.services import memory_search, ranking

    found = memory_search.memory_search(
        tenant=tenant_a, query="Biscuit the puppy", scope=memory_search.SearchScope(user_id="u1"),
        neighbours=1, plan=ranking.Plan(stem=False, window_radius=1), min_similarity=-1,
    )  # fmt: skip
    assert found.results and any(hit.neighbours for hit in found.results)
    assert search_result_out(found) == SearchOutputSerializer(found).data
    assert search_result_out(found)["plan"]["stem"] is False
