"""Context recall: the window forgets, the `recall` component finds it again (real model)."""

from __future__ import annotations

from typing import Any

import pytest

from memory.services import message_indexing
from memory.services.context import SystemPart, context_build
from memory.services.sessions import MessageInput, messages_append, session_create

pytestmark = pytest.mark.django_db


def say(tenant: Any, session: Any, *texts: str) -> None:
    messages_append(
        tenant=tenant,
        session=session,
        items=[MessageInput(role="user", content=t, name="Caroline") for t in texts],
    )


@pytest.fixture
def months_ago(tenant_a):  # type: ignore[no-untyped-def]
    """User u1's first session with `bot`; another user's session with the same agent."""
    old = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    say(tenant_a, old, "I adopted a golden retriever puppy named Biscuit.", "The weather was rainy all week.")
    stranger = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u2")
    say(tenant_a, stranger, "My goldfish is named Captain Bubbles.")
    return old


def recall_items(built: Any) -> list[dict[str, Any]]:
    return [i for i in built.manifest["items"] if i["kind"] == "recall"]


def test_an_earlier_sessions_message_is_recalled_for_a_question_about_it(tenant_a, months_ago):
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    say(tenant_a, now, "Work is busy.")
    message_indexing.memory_index_drain()
    built = context_build(
        tenant=tenant_a, session=now, next_input="What was the name of my dog again?",
        system_parts=[SystemPart(name="core", content="You are helpful.")],
    )  # fmt: skip
    recalled = recall_items(built)
    assert recalled, built.manifest["items"]
    top = recalled[0]
    assert top["source"] == "message" and top["session"] == months_ago.public_id and top["seq"] == 1
    assert top["included"] and top["score"] > 0 and top["reason"].startswith("recalled: an earlier session")
    assert "dense" in top["contributions"]
    # placed at the start, right after the system parts
    assert built.messages[0]["content"] == "You are helpful."
    assert "Biscuit" in built.messages[1]["content"] and "Caroline" in built.messages[1]["content"]
    assert built.budget["components"]["recall"] > 0
    assert built.recall_policy.top_k == 20 and built.recall_policy.max_tokens == 1000


def test_another_users_sessions_are_never_recalled(tenant_a, months_ago):
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    message_indexing.memory_index_drain()
    built = context_build(
        tenant=tenant_a, session=now, next_input="What is my goldfish called, Captain Bubbles?"
    )
    assert all("Captain Bubbles" not in m["content"] for m in built.messages[:-1])
    assert {i["session"] for i in recall_items(built)} <= {months_ago.public_id}


def test_what_the_window_holds_is_not_recalled_again(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    say(tenant_a, session, "My sister moved to Lisbon for a design job.", "Anyway, how are you?")
    message_indexing.memory_index_drain()
    built = context_build(tenant=tenant_a, session=session, next_input="Where did my sister move?")
    assert recall_items(built) == []  # both messages are in the window already
    narrow = context_build(
        tenant=tenant_a,
        session=session,
        next_input="Where did my sister move?",
        overrides={"history_window": 1},
    )
    recalled = recall_items(narrow)
    assert [(i["session"], i["seq"]) for i in recalled][:1] == [(session.public_id, 1)]
    assert recalled[0]["reason"].startswith("recalled: an older message of this session")


def test_position_end_budget_share_and_disabling_per_request(tenant_a, months_ago):
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    message_indexing.memory_index_drain()
    question = "What was the name of my dog again?"
    end = context_build(tenant=tenant_a, session=now, next_input=question, recall={"position": "end"})
    count = len(recall_items(end))
    assert end.messages[-1]["content"] == question
    placed = end.messages[-1 - count : -1]  # right before the input, best first
    assert (
        count
        and all(m["role"] == "user" and "Recalled" in m["content"] for m in placed)
        and "Biscuit" in placed[0]["content"]
    )
    assert (
        recall_items(
            context_build(tenant=tenant_a, session=now, next_input=question, recall={"enabled": False})
        )
        == []
    )
    assert (
        recall_items(
            context_build(tenant=tenant_a, session=now, next_input=question, recall={"budget_share": 0.00001})
        )
        == []
    )
    explicit = context_build(
        tenant=tenant_a, session=now, next_input="ok", recall={"query": "golden retriever puppy"}
    )
    assert recall_items(explicit)[0]["seq"] == 1


def test_the_tenant_policy_sets_the_defaults(tenant_a, months_ago):
    from memory.models import MemoryPolicy

    MemoryPolicy.objects.update_or_create(tenant=tenant_a, defaults={"recall_enabled": False})
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    message_indexing.memory_index_drain()
    built = context_build(tenant=tenant_a, session=now, next_input="What was the name of my dog again?")
    assert recall_items(built) == [] and built.recall_policy.enabled is False


def test_bad_recall_overrides_are_refused_naming_the_field(api_a):
    session = api_a.post("/api/v1/sessions", {"agent": "bot"}, format="json").json()["id"]
    for recall, field in (({"top_k": "x"}, "recall.top_k"), ({"colour": 1}, "recall.colour"),
                          ({"position": "middle"}, "recall.position")):  # fmt: skip
        response = api_a.post(
            f"/api/v1/sessions/{session}/context", {"input": "hi", "recall": recall}, format="json"
        )
        assert response.status_code == 422, response.content
        assert field in response.json()["error"]["details"]["fields"]


def test_the_api_takes_an_explicit_query(api_a, tenant_a, months_ago):
    session = api_a.post("/api/v1/sessions", {"agent": "bot", "user_id": "u1"}, format="json").json()["id"]
    message_indexing.memory_index_drain()
    body = api_a.post(
        f"/api/v1/sessions/{session}/context", {"input": "thanks", "query": "puppy Biscuit"}, format="json"
    ).json()
    recalled = [i for i in body["manifest"]["items"] if i["kind"] == "recall"]
    assert recalled[0]["session"] == months_ago.public_id and recalled[0]["score"] is not None


def test_turns_of_one_session_share_one_excerpt_in_conversation_order(tenant_a):
    old = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u3")
    say(
        tenant_a, old,
        "My sister Lina is getting married in June.",
        "The printer at work jammed again.",
        "Lina's wedding is at a vineyard near Lake Como.",
    )  # fmt: skip
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u3")
    message_indexing.memory_index_drain()
    built = context_build(
        tenant=tenant_a, session=now, next_input="Where and when is Lina's wedding?", recall={"top_k": 10}
    )
    recalled = [i for i in recall_items(built) if i["source"] == "message"]
    assert len(recalled) == 1, recalled  # one block for the session, not one per turn
    excerpt = recalled[0]
    assert {1, 3} <= set(excerpt["seqs"]) and excerpt["seqs"] == sorted(excerpt["seqs"]), excerpt
    text = next(m["content"] for m in built.messages if "Lake Como" in m["content"])
    assert text.index("married in June") < text.index("Lake Como")  # conversation order
    assert excerpt["tokens"] == built.budget["components"]["recall"]  # the block's real cost


def test_the_scores_drop_decides_how_much_is_recalled(tenant_a):
    old = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u4")
    say(
        tenant_a, old,
        "I adopted a golden retriever puppy named Biscuit.",
        "Biscuit the dog loves the park by the river.",
        "My dog sleeps on the sofa.",
    )  # fmt: skip
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u4")
    message_indexing.memory_index_drain()
    cut = {"top_k": 10, "min_score": -10.0, "min_similarity": -1.0}
    question = "What was the name of my dog again?"
    wide = context_build(
        tenant=tenant_a, session=now, next_input=question, recall={**cut, "relative_gap": 10.0}
    )
    narrow = context_build(
        tenant=tenant_a, session=now, next_input=question, recall={**cut, "relative_gap": 0.0}
    )
    wide_seqs = set().union(*[set(i["seqs"]) for i in recall_items(wide)])
    narrow_seqs = set().union(*[set(i["seqs"]) for i in recall_items(narrow)])
    assert wide_seqs == {1, 2, 3}, recall_items(wide)  # every turn about the dog
    assert len(narrow_seqs) == 1 and narrow_seqs < wide_seqs, recall_items(narrow)  # only the best
    assert narrow.budget["components"]["recall"] < wide.budget["components"]["recall"]


def test_recall_takes_at_most_max_tokens_whatever_the_models_window(tenant_a):
    from memory.models import MemoryPolicy

    pets = ["Biscuit", "Pepper", "Miso", "Waffles", "Nube", "Juno", "Olive", "Pickle", "Mochi", "Tofu",
            "Ziggy", "Bean"]  # fmt: skip
    for name in pets:  # one earlier session each: each recalled turn is its own excerpt block
        old = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u5")
        text = (
            f"Our dog {name} chewed the garden hose again and then slept in the sun all afternoon, "
            f"so the vet says {name} needs a longer walk by the river every single morning."
        )
        say(tenant_a, old, text)
    now = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u5")
    message_indexing.memory_index_drain()
    question = "What did the vet say about the dog chewing the garden hose and needing longer walks?"
    wide = {
        "top_k": 50,
        "min_score": -10.0,
        "min_similarity": -1.0,
        "relative_gap": 10.0,
        "budget_share": 1.0,
    }

    def recalled_tokens(**recall: Any) -> int:
        built = context_build(tenant=tenant_a, session=now, next_input=question, recall={**wide, **recall})
        assert built.recall_policy.max_tokens == recall.get("max_tokens", built.recall_policy.max_tokens)
        return sum(int(i["tokens"]) for i in recall_items(built) if i["included"])

    unbounded = recalled_tokens(max_tokens=100_000)
    assert unbounded > 1000  # every session's turn fits the model's window share
    default = recalled_tokens()
    assert 600 < default <= 1000  # the default ceiling, filled best first
    assert 0 < recalled_tokens(max_tokens=300) <= 300
    MemoryPolicy.objects.update_or_create(tenant=tenant_a, defaults={"recall_max_tokens": 500})
    assert 0 < recalled_tokens() <= 500  # the tenant's policy sets the default
    assert recalled_tokens(max_tokens=0) == 0  # no recall at all
