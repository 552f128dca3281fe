"""The `user_profile` component: a build in a new session of a user carries what is known about the
user now (never a superseded value), within its share of the budget, best first when not all fit,
each memory explained in the manifest; another agent's memories only when the tenant shares them,
and never with the system role."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from memory.models import ModelProfile
from memory.services import sharing, tokens
from memory.services.context import SystemPart, context_build
from memory.services.context_items import CARRIED_OVER_NOTE
from memory.services.sessions import MessageInput, messages_append, session_create
from memory.services.user_memory.store import memory_record

O200K = tokens.TokenCounter("o200k_base")


def _profile(built: Any) -> dict[str, Any]:
    [entry] = [i for i in built.manifest["items"] if i["kind"] == "user_profile"]
    return entry


def _remember(
    tenant: Any, subject: str, text: str, *, kind: str = "fact", agent: str = "bot", **kw: Any
) -> Any:
    return memory_record(
        tenant=tenant, user_id="u-42", subject=subject, text=text, memory_type=kind, agent=agent, **kw
    ).memory


def test_a_new_session_of_the_user_carries_the_current_value_not_the_superseded_one(tenant_a):
    earlier = timezone.now() - timedelta(days=60)
    _remember(tenant_a, "home.city", "The user lives in Porto.", kind="profile", at=earlier)
    current = _remember(tenant_a, "home.city", "The user moved to Lisbon.", kind="profile")
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-42", model_name="gpt-4o")

    built = context_build(
        tenant=tenant_a,
        session=session,
        next_input="Which neighbourhoods near me are good for a walk?",
        system_parts=[SystemPart("core", "You are a travel helper.")],
    )

    prompt = "\n".join(str(m["content"]) for m in built.messages)
    assert "Lisbon" in prompt
    assert "Porto" not in prompt
    entry = _profile(built)
    assert [m["id"] for m in entry["memories"]] == [current.public_id]
    assert entry["memories"][0]["included"] and entry["memories"][0]["reason"].startswith("included: profile")
    # With the system parts, before history and the input; a user-role data block, not an instruction.
    assert built.messages[0] == {"role": "system", "content": "You are a travel helper."}
    assert built.messages[1]["role"] == "user"
    assert CARRIED_OVER_NOTE in built.messages[1]["content"] and "Lisbon" in built.messages[1]["content"]
    assert built.budget["components"]["user_profile"] == entry["tokens"] > 0
    assert sum(built.budget["components"].values()) == built.budget["prompt_tokens"]
    assert O200K.prompt_tokens(built.messages) == built.budget["prompt_tokens"]


def test_the_share_holds_and_constraints_and_relevant_memories_go_first(tenant_a):
    ModelProfile.objects.create(
        tenant=tenant_a, name="small", input_limit=3000, output_limit=500, tokenizer="o200k_base"
    )
    for n in range(40):
        _remember(tenant_a, f"trivia.{n}", f"The user once mentioned trivia item number {n} about stamps.")
    diet = _remember(tenant_a, "diet", "The user is vegetarian and never eats fish.", kind="constraint")
    dog = _remember(tenant_a, "pets.dog", "The user has a beagle puppy called Miso.", confidence=0.8)
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-42", model_name="small")
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="Hello")])

    built = context_build(tenant=tenant_a, session=session, next_input="What should I feed my puppy Miso?")

    entry = _profile(built)
    allowance = int(built.budget["budget_tokens"] * built.policy.user_profile_share)
    assert entry["allowance_tokens"] == allowance == 250
    assert 0 < built.budget["components"]["user_profile"] <= allowance
    memories = entry["memories"]
    chosen = [m for m in memories if m["included"]]
    left_out = [m for m in memories if not m["included"]]
    # Every chosen memory is listed, and the best 20 of those left out; the rest are counted.
    assert chosen and len(left_out) == 20
    assert len(chosen) + len(left_out) + entry["memories_not_listed"] == 42
    # The relevant memory and the constraint beat trivia; every one left out says why.
    assert [m["id"] for m in chosen[:2]] == [dog.public_id, diet.public_id]
    assert all("over the user_profile share" in m["reason"] for m in left_out)
    scores = [m["score"] for m in memories]
    assert scores == sorted(scores, reverse=True)
    assert min(m["score"] for m in chosen) >= max(m["score"] for m in left_out)

    # The share is a policy field: 0 leaves the user's memories out; a cap bounds it in tokens.
    off = context_build(
        tenant=tenant_a, session=session, next_input="Hi", overrides={"user_profile_share": 0}
    )
    assert not [i for i in off.manifest["items"] if i["kind"] == "user_profile"]
    capped = context_build(
        tenant=tenant_a, session=session, next_input="Hi", overrides={"user_profile_max_tokens": 120}
    )
    assert 0 < capped.budget["components"]["user_profile"] <= 120


def test_another_agents_memory_enters_only_when_the_tenant_shares_user_memories(tenant_a):
    _remember(tenant_a, "work.employer", "The user works at Acme Robotics.", agent="bot")
    other = _remember(tenant_a, "bank.account", "The user's bank is Fjord Savings.", agent="billing-bot")
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-42", model_name="gpt-4o")

    built = context_build(tenant=tenant_a, session=session, next_input="Where does my salary go?")
    prompt = "\n".join(str(m["content"]) for m in built.messages)
    assert "Acme" in prompt and "Fjord" not in prompt
    assert other.public_id not in {m["id"] for m in _profile(built)["memories"]}

    sharing.sharing_policy_update(tenant=tenant_a, changes={"share_user_memories": True})
    shared = context_build(tenant=tenant_a, session=session, next_input="Where does my salary go?")
    block = next(m for m in shared.messages if "Fjord" in str(m["content"]))
    assert block["role"] == "user" and "[from agent billing-bot]" in block["content"]
    assert {m["id"]: m["agent"] for m in _profile(shared)["memories"]}[other.public_id] == "billing-bot"


def test_a_session_without_user_or_another_users_memories_carry_none(tenant_a):
    _remember(tenant_a, "home.city", "The user lives in Lisbon.")
    anonymous = session_create(tenant=tenant_a, agent_external_id="bot", model_name="gpt-4o")
    someone_else = session_create(
        tenant=tenant_a, agent_external_id="bot", user_id="u-7", model_name="gpt-4o"
    )
    for session in (anonymous, someone_else):
        built = context_build(tenant=tenant_a, session=session, next_input="Where do I live?")
        assert "Lisbon" not in "\n".join(str(m["content"]) for m in built.messages)
        assert not [i for i in built.manifest["items"] if i["kind"] == "user_profile"]


def test_over_budget_the_block_gives_way_before_required_parts_and_says_so(tenant_a):
    ModelProfile.objects.create(
        tenant=tenant_a, name="tiny", input_limit=700, output_limit=100, tokenizer="o200k_base"
    )
    diet = "The user is vegetarian. " + "They avoid fish, eggs and gelatine in every meal. " * 3
    _remember(tenant_a, "diet", diet, kind="constraint")
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-42", model_name="tiny")

    built = context_build(
        tenant=tenant_a,
        session=session,
        next_input="Plan dinner. " * 55,
        system_parts=[SystemPart("core", "You plan meals. " * 90)],
        overrides={"user_profile_share": 0.5},
    )

    entry = _profile(built)
    assert not entry["included"] and entry["reason"].startswith("over budget")
    assert entry["memories"][0]["included"] is False
    assert "vegetarian" not in "\n".join(str(m["content"]) for m in built.messages)


def test_relevance_by_meaning_uses_the_memorys_stored_embedding(tenant_a):
    from memory.services import embedding

    beagle = _remember(tenant_a, "pets", "The user owns a beagle.")
    stamps = _remember(tenant_a, "hobby", "The user collects stamps.")
    for memory in (beagle, stamps):
        memory.embedding = embedding.embed_query(memory.text)[1]
        memory.save(update_fields=["embedding"])
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u-42", model_name="gpt-4o")

    built = context_build(tenant=tenant_a, session=session, next_input="What food suits my dog?")

    by_id = {m["id"]: m for m in _profile(built)["memories"]}
    # No word in common with the question: only the meaning can tell the two apart.
    assert by_id[beagle.public_id]["relevance"] > by_id[stamps.public_id]["relevance"] + 0.1
    assert _profile(built)["memories"][0]["id"] == beagle.public_id
