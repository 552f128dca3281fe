"""Best first, nothing unrelated: one score scale across kinds and the relevance floor.

One user talked about a hiking trail, a sister Lina's wedding and a puppy, and has user memories
about them (pointing at the turns they came from, one of them superseded by a move); the same
tenant holds three experiences about operations work (database failover, CDN purge, TLS renewal)
that none of the user's questions is about. Real PostgreSQL, the real embedder, through the API. The
assertions are invariants of any good answer, not a fixed order.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from memory.models import Experience
from memory.services import message_indexing
from memory.services.experiences.embed import experiences_embed
from memory.services.user_memory.store import memory_record

pytestmark = pytest.mark.django_db

SEARCH = "/api/v1/memory/search"
UNRELATED = {
    "failover": ("The primary PostgreSQL database went down at night",
                 "Promote the streaming replica with pg_ctl promote and repoint the connection pooler"),
    "cdn": ("Stale assets served after a deploy",
            "Purge the CDN cache for the /static prefix and bump the asset hash"),
    "tls": ("The TLS certificate expired and browsers refused the site",
            "Renew it with certbot renew and reload nginx"),
}  # fmt: skip
QUESTIONS = (
    "Where is Lina's wedding?",
    "When is my sister getting married?",
    "Which hiking trail did I walk?",
    "How long was the hike and what did I see at the top?",
    "What is my puppy called?",
    "What breed is the dog and what does he chew?",
)


def post(api: Any, path: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    response = api.post(path, body, format="json")
    assert response.status_code == status, response.content
    return response.json()


MEMORIES = {
    "family.sister.wedding": (
        "Maya's sister Lina gets married in June at a vineyard near Lake Como.",
        (4, 6),
    ),
    "pet.dog": ("Maya has a beagle puppy called Pepper who chews shoes.", (7, 9)),
    "hobby.hiking": ("Maya hikes; she walked the Eagle Ridge trail (eleven miles).", (1,)),
}


@pytest.fixture
def user_memory(api_a: Any, tenant_a: Any) -> str:
    session = post(api_a, "/api/v1/sessions", {"agent": "bot", "user_id": "maya"})["id"]
    turns = [
        ("Maya", "Last Saturday I hiked the Eagle Ridge trail, eleven miles with a steep climb."),
        ("Bot", "That sounds tough! What was the view like?"),
        ("Maya", "From the summit you could see three lakes and the whole valley."),
        ("Maya", "My sister Lina is getting married in June."),
        ("Bot", "Congratulations to her! Where will the wedding be?"),
        ("Maya", "Lina's wedding is at a vineyard near Lake Como in Italy."),
        ("Maya", "Also, we adopted a puppy, a beagle called Pepper."),
        ("Bot", "Lovely. How is Pepper settling in?"),
        ("Maya", "Pepper chews every shoe in the house."),
    ]
    messages = [
        {"role": "user" if name == "Maya" else "assistant", "name": name, "content": text}
        for name, text in turns
    ]
    first = post(api_a, f"/api/v1/sessions/{session}/messages", {"messages": messages})["first_seq"]
    for subject, (text, turns_at) in MEMORIES.items():
        sources = [{"session": session, "seq": first + n - 1} for n in turns_at]
        memory_record(
            tenant=tenant_a, user_id="maya", subject=subject, text=text, sources=sources, agent="bot"
        )
    memory_record(
        tenant=tenant_a, user_id="maya", subject="home.city", text="Maya lives in Porto.", agent="bot"
    )
    memory_record(
        tenant=tenant_a, user_id="maya", subject="home.city", text="Maya moved to Lisbon.", agent="bot"
    )
    for problem, solution in UNRELATED.values():
        post(api_a, "/api/v1/experiences", {"problem": problem, "solution": solution})
    message_indexing.memory_index_drain()
    experiences_embed(experience_ids=list(Experience.objects.values_list("pk", flat=True)))
    assert not Experience.objects.exclude(embedding_status="completed").exists()
    return session


def search(api: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    return post(api, SEARCH, body, status=200)["results"]


@pytest.mark.parametrize("question", QUESTIONS)
def test_best_first_and_nothing_unrelated_in_the_top_five(api_a, user_memory, question):
    results = search(api_a, {"query": question, "scope": {"user_id": "maya"}, "limit": 20})
    assert results and results[0]["kind"] in ("message", "user_memory"), results
    scores = [hit["score"] for hit in results]
    assert all(a >= b for a, b in itertools.pairwise(scores)), scores
    for hit in results:
        assert abs(sum(hit["contributions"].values()) - hit["score"]) < 1e-4, hit
    assert [hit["kind"] for hit in results[:5]].count("experience") == 0, results[:5]


def test_an_unrelated_experience_is_not_listed_at_all(api_a, user_memory):
    # Nothing in the failover, CDN and TLS experiences shares a word or a meaning with the
    # question: below the floor, they are left out, not merely ranked low.
    results = search(api_a, {"query": "Where is Lina's wedding?", "scope": {"user_id": "maya"}, "limit": 50})
    assert [hit for hit in results if hit["kind"] == "experience"] == []
    # With the floor lowered to nothing they are there, so the floor, not the pool, left them out.
    floorless = search(
        api_a,
        {
            "query": "Where is Lina's wedding?",
            "scope": {"user_id": "maya"},
            "limit": 50,
            "min_similarity": -1,
        },
    )
    assert len([hit for hit in floorless if hit["kind"] == "experience"]) == len(UNRELATED)


def test_an_experience_the_question_is_about_ranks_among_the_messages(api_a, user_memory):
    results = search(api_a, {"query": "How do I renew an expired TLS certificate?", "limit": 20})
    assert results[0]["kind"] == "experience" and "certbot" in results[0]["text"]
    scores = [hit["score"] for hit in results]
    assert all(a >= b for a, b in itertools.pairwise(scores)), scores


def test_the_floor_is_a_cosine_and_refuses_anything_else(api_a, user_memory):
    for bad in (1.5, -2, "high"):
        response = api_a.post(SEARCH, {"query": "wedding", "min_similarity": bad}, format="json")
        assert response.status_code == 422, response.content
        assert "min_similarity" in response.json()["error"]["details"]["fields"]


@pytest.mark.parametrize("question", QUESTIONS[:3])
def test_context_recall_brings_back_the_users_memory_and_no_unrelated_experience(
    api_a, user_memory, question
):
    later = post(api_a, "/api/v1/sessions", {"agent": "bot", "user_id": "maya"})["id"]
    body = post(api_a, f"/api/v1/sessions/{later}/context", {"input": question}, status=200)
    recalled = [item for item in body["manifest"]["items"] if item["kind"] == "recall"]
    assert recalled, body["manifest"]["items"]
    assert {item["source"] for item in recalled} <= {"message", "summary", "fact", "user_memory"}, recalled


def test_a_summary_and_an_experience_saying_the_same_score_alike(api_a, user_memory, tenant_a):
    from memory.models import Session, Summary

    experience = Experience.objects.get(problem=UNRELATED["tls"][0])
    Summary.objects.create(
        tenant=tenant_a, session=Session.objects.get(user_id="maya"), text=experience.text,
        covers_up_to_seq=9, folded_from_seq=1, folded_to_seq=9, folded_count=9,
        tokens_before=100, tokens_after=30,
    )  # fmt: skip
    results = search(api_a, {"query": "renew the expired TLS certificate", "scope": {"user_id": "maya"}})
    same = {hit["kind"]: hit for hit in results if hit["text"] == experience.text}
    assert set(same) == {"summary", "experience"}, results
    assert same["summary"]["score"] == pytest.approx(same["experience"]["score"], abs=1e-6)
    assert same["summary"]["contributions"] == pytest.approx(same["experience"]["contributions"], abs=1e-6)


@pytest.mark.parametrize("question", QUESTIONS)
def test_user_memories_share_the_score_scale_and_the_order(api_a, user_memory, question):
    results = search(api_a, {"query": question, "scope": {"user_id": "maya"}, "limit": 20})
    scores = [hit["score"] for hit in results]
    assert all(a >= b for a, b in itertools.pairwise(scores)), scores
    memories = [hit for hit in results if hit["kind"] == "user_memory"]
    assert memories, results
    for hit in memories:
        assert abs(sum(hit["contributions"].values()) - hit["score"]) < 1e-4, hit
        assert all(source["session"] == user_memory for source in hit["sources"]), hit
    assert [hit["kind"] for hit in results[:5]].count("experience") == 0, results[:5]


def test_a_user_memory_is_found_by_meaning_alone_and_points_at_its_turns(api_a, user_memory):
    # No word of the question is in the memory ("sibling", "ceremony" vs "sister", "married").
    results = search(
        api_a, {"query": "sibling ceremony abroad", "scope": {"user_id": "maya"}, "kinds": ["user_memory"]}
    )
    assert results and "Lake Como" in results[0]["text"], results
    assert [source["seq"] for source in results[0]["sources"]] == [4, 6]
    assert "neighbours" not in results[0]


def test_only_the_current_value_unless_as_of(api_a, user_memory):
    from memory.models import UserMemory

    body = {"query": "Where does Maya live?", "scope": {"user_id": "maya"}, "kinds": ["user_memory"]}
    texts = [hit["text"] for hit in search(api_a, body)]
    assert "Maya moved to Lisbon." in texts and "Maya lives in Porto." not in texts, texts
    old = UserMemory.objects.get(text="Maya lives in Porto.")
    assert old.valid_to is not None  # superseded by the move
    at = old.valid_from + (old.valid_to - old.valid_from) / 2
    texts = [hit["text"] for hit in search(api_a, {**body, "as_of": at.isoformat()})]
    assert "Maya lives in Porto." in texts and "Maya moved to Lisbon." not in texts, texts


def test_another_users_memories_are_not_in_a_users_scope(api_a, user_memory, tenant_a):
    memory_record(tenant=tenant_a, user_id="omar", subject="family.sister.wedding",
                  text="Omar's sister's wedding is in Lima.", agent="bot")  # fmt: skip
    results = search(api_a, {"query": "sister's wedding", "scope": {"user_id": "maya"}, "limit": 50})
    assert results and not [hit for hit in results if "Omar" in hit["text"]], results
    other = search(
        api_a, {"query": "sister's wedding", "scope": {"user_id": "omar"}, "kinds": ["user_memory"]}
    )
    assert [hit["text"] for hit in other] == ["Omar's sister's wedding is in Lima."]


def test_recall_brings_a_user_memory_with_the_turns_it_was_taken_from(api_a, user_memory):
    later = post(api_a, "/api/v1/sessions", {"agent": "bot", "user_id": "maya"})["id"]
    body = post(api_a, f"/api/v1/sessions/{later}/context", {"input": "Where is Lina's wedding?"}, status=200)
    items = body["manifest"]["items"]
    recalled = [item for item in items if item["kind"] == "recall"]
    # The memory is in the prompt once: in the user profile block (which carries the user's
    # current memories) or, when the block left it out, as a recalled item.
    [profile] = [item for item in items if item["kind"] == "user_profile"]
    in_profile = [m for m in profile["memories"] if m["included"] and m["subject"] == "family.sister.wedding"]
    as_recall = [item for item in recalled if item["source"] == "user_memory"]
    assert len(in_profile) + len(as_recall) == 1, (profile, recalled)
    assert "Lake Como" in str(body["messages"]), body["messages"]
    excerpts = [item for item in recalled if item["source"] == "message"]
    turns = [(item["session"], seq) for item in excerpts for seq in item["seqs"]]
    assert {(user_memory, 4), (user_memory, 6)} <= set(turns), recalled
    assert len(turns) == len(set(turns)) and len(excerpts) == 1  # each turn once, one block per session


def test_a_shared_memory_does_not_bring_turns_of_another_agents_session(api_a, user_memory, tenant_a):
    from memory.services.sharing import sharing_policy_update

    sharing_policy_update(tenant=tenant_a, changes={"share_user_memories": True})
    other = post(api_a, "/api/v1/sessions", {"agent": "helper", "user_id": "maya"})["id"]
    body = post(api_a, f"/api/v1/sessions/{other}/context", {"input": "Where is Lina's wedding?"}, status=200)
    items = body["manifest"]["items"]
    recalled = [item for item in items if item["kind"] == "recall"]
    [profile] = [item for item in items if item["kind"] == "user_profile"]
    shared = [m for m in profile["memories"] if m["included"]] + [
        item for item in recalled if item["source"] == "user_memory"
    ]
    assert shared, (profile, recalled)  # shared with this agent
    assert not [item for item in recalled if item["session"] == user_memory and item["source"] == "message"]
