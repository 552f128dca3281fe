"""Decay service: rounds, reference detection, restatement, build/summary alerts, promotion."""

from __future__ import annotations

from typing import Any

import pytest

from memory.models import DecayPolicy, Event, Experience, FactReference, FactRoundCounter, TrackedFact
from memory.services import decay
from memory.services.sessions import MessageInput, messages_append, session_create, session_end

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(tenant_a):
    return session_create(tenant=tenant_a, agent_external_id="planner", user_id="u-1")


def say(tenant: Any, session: Any, role: str, content: str, **fields: Any) -> Any:
    return messages_append(
        tenant=tenant, session=session, items=[MessageInput(role=role, content=content, **fields)]
    )[0]


def rounds_of_filler(tenant: Any, session: Any, count: int) -> None:
    items = []
    for _ in range(count):
        items += [
            MessageInput(role="user", content="Go on."),
            MessageInput(role="assistant", content="Going on."),
        ]
    messages_append(tenant=tenant, session=session, items=items)


def register(tenant: Any, session: Any, key: str, type_: str, content: str) -> TrackedFact:
    return decay.fact_register(tenant=tenant, session=session, key=key, fact_type=type_, content=content).fact


def events(tenant: Any, type_: str) -> list[Event]:
    return list(Event.objects.filter(tenant=tenant, type=type_).order_by("seq"))


def test_key_terms_drop_stop_words_and_meet_across_word_forms():
    assert decay.key_terms("The caches are caching; cache it!") == ["cach"]
    assert decay.key_terms("Tests tested testing") == ["test"]
    assert decay.key_terms("We use it in 42 ways, OK?") == ["42", "way"]


def test_rounds_are_user_turns_across_batches(tenant_a, session):
    say(tenant_a, session, "system", "You are helpful.")
    assert decay.session_round(session=session) == 0
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="user", content="one"),
            MessageInput(role="assistant", content="a"),
            MessageInput(role="tool", content="t"),
            MessageInput(role="user", content="two"),
        ],
    )
    assert decay.session_round(session=session) == 2
    fact = register(tenant_a, session, "k", "goal", "Ship the reporting feature")
    assert fact.registered_round == 2
    rounds_of_filler(tenant_a, session, 3)
    assert FactRoundCounter.objects.get(session=session).rounds == 5


def test_references_in_a_batch_get_the_round_of_their_message(tenant_a, session):
    say(tenant_a, session, "user", "Hi.")
    fact = register(tenant_a, session, "budget", "constraint", "Budget limit is forty thousand euros")
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="user", content="Go on."),
            MessageInput(role="assistant", content="The forty thousand euros limit holds."),
            MessageInput(role="user", content="Go on."),
        ],
    )
    fact.refresh_from_db()
    assert fact.last_referenced_round == 2
    reference = FactReference.objects.get(fact=fact, method="key_terms")
    assert (reference.round, reference.message_seq) == (2, 3)


def test_a_fact_decays_again_after_a_new_reference_with_a_new_event(tenant_a, session):
    say(tenant_a, session, "user", "Start.")
    fact = register(tenant_a, session, "pref", "user_preference", "Answer in French")
    rounds_of_filler(tenant_a, session, 9)
    assert events(tenant_a, "fact.decayed") == []
    rounds_of_filler(tenant_a, session, 1)  # round 11: 10 rounds since round 1
    fact.refresh_from_db()
    assert fact.decayed and fact.decayed_round == 11 and fact.decay_count == 1
    rounds_of_filler(tenant_a, session, 3)  # still decayed: no second event for the same crossing
    assert len(events(tenant_a, "fact.decayed")) == 1
    say(tenant_a, session, "user", "Remember: answer in French.")  # round 15
    fact.refresh_from_db()
    assert not fact.decayed and fact.last_referenced_round == 15
    rounds_of_filler(tenant_a, session, 10)  # round 25
    crossings = events(tenant_a, "fact.decayed")
    assert [e.payload["decayed_round"] for e in crossings] == [11, 25]
    assert crossings[1].payload["recommendation"] == "restate_now"
    assert crossings[1].payload["gen_ai.conversation.id"] == session.public_id


def test_a_paraphrase_is_found_by_embedding_similarity(tenant_a, session):
    say(tenant_a, session, "user", "Start.")
    fact = register(tenant_a, session, "migration", "goal", "Migrate the billing service to PostgreSQL")
    assert fact.embedding is not None and len(fact.embedding) == 384 and fact.embedding_model
    rounds_of_filler(tenant_a, session, 3)
    say(tenant_a, session, "user", "The billing page has a typo.")  # shares a term, unrelated
    fact.refresh_from_db()
    assert fact.last_referenced_round == 1
    say(tenant_a, session, "user", "Move billing from MySQL to Postgres.")  # round 6
    fact.refresh_from_db()
    assert fact.last_referenced_round == 6
    reference = FactReference.objects.get(fact=fact, method="embedding")
    assert reference.score >= DecayPolicy.for_tenant(tenant_a).reference_similarity


def test_without_embeddings_only_key_terms_count(tenant_a, session):
    policy = DecayPolicy.for_tenant(tenant_a)
    policy.reference_use_embeddings = False
    policy.save()
    say(tenant_a, session, "user", "Start.")
    fact = register(tenant_a, session, "migration", "goal", "Migrate the billing service to PostgreSQL")
    assert fact.embedding is None
    say(tenant_a, session, "user", "Move billing from MySQL to Postgres.")
    fact.refresh_from_db()
    assert fact.last_referenced_round == 1


def test_facts_for_context_restates_decayed_facts_first(tenant_a, session):
    say(tenant_a, session, "user", "Start.")
    old_goal = register(tenant_a, session, "goal", "goal", "Ship the reporting feature")
    rounds_of_filler(tenant_a, session, 5)
    pref = register(tenant_a, session, "pref", "user_preference", "Answer in French")
    decision = register(tenant_a, session, "db", "decision", "Use PostgreSQL everywhere")
    register(tenant_a, session, "note", "note", "The office coffee machine is broken")
    rounds_of_filler(tenant_a, session, 6)  # round 12: goal decayed (11 rounds), pref fresh (6)
    pinned = decay.facts_for_context(tenant=tenant_a, session=session)
    assert [(p.fact_id, p.restated) for p in pinned] == [(old_goal.public_id, True), (pref.public_id, False)]
    assert pinned[0].importance == "high" and pinned[0].content == "Ship the reporting feature"

    policy = DecayPolicy.for_tenant(tenant_a)
    policy.pin_high_importance, policy.restate_medium = False, True
    policy.save()
    rounds_of_filler(tenant_a, session, 20)
    pinned = decay.facts_for_context(tenant=tenant_a, session=session)
    assert [p.fact_id for p in pinned] == [old_goal.public_id, pref.public_id, decision.public_id]
    assert all(p.restated for p in pinned)


def test_after_build_restating_counts_as_a_reference_and_records_the_injection(tenant_a, session):
    say(tenant_a, session, "user", "Start.")
    goal = register(tenant_a, session, "goal", "goal", "Ship the reporting feature")
    rounds_of_filler(tenant_a, session, 8)
    pref = register(tenant_a, session, "pref", "user_preference", "Answer in French")
    rounds_of_filler(tenant_a, session, 3)  # round 12
    goal.refresh_from_db()
    assert goal.decayed
    pinned = decay.facts_for_context(tenant=tenant_a, session=session)
    ids = [p.fact_id for p in pinned]
    warnings = decay.facts_after_build(
        tenant=tenant_a, session=session, included_fact_ids=ids, dropped_fact_ids=[], prompt_text="…"
    )
    assert warnings == []
    goal.refresh_from_db()
    pref.refresh_from_db()
    assert (goal.decayed, goal.last_referenced_round, goal.last_injected_round) == (False, 12, 12)
    assert goal.last_injected_at is not None and goal.injection_count == 1
    assert FactReference.objects.filter(fact=goal, method="restated", round=12).exists()
    # a pinned fact that had not decayed is injected, but that is not a new reference
    assert (pref.last_referenced_round, pref.last_injected_round) == (9, 12)
    assert decay.facts_for_context(tenant=tenant_a, session=session)[0].restated is False
    listed = decay.facts_list(tenant=tenant_a, session=session, decayed=True)[1]
    assert listed == []


def test_a_dropped_high_importance_fact_raises_an_alert(tenant_a, session):
    say(tenant_a, session, "user", "Start.")
    goal = register(tenant_a, session, "goal", "goal", "Ship the reporting feature")
    budget = register(tenant_a, session, "budget", "constraint", "Budget limit is forty thousand euros")
    decision = register(tenant_a, session, "db", "decision", "Use PostgreSQL everywhere")
    warnings = decay.facts_after_build(
        tenant=tenant_a,
        session=session,
        included_fact_ids=[],
        dropped_fact_ids=[goal.public_id, budget.public_id, decision.public_id],
        prompt_text="user: remember the budget limit of forty thousand euros",
    )
    assert len(warnings) == 1 and "'goal'" in warnings[0] and goal.public_id in warnings[0]
    alerts = events(tenant_a, "fact.alert")
    assert [(e.payload["fact"], e.payload["reason"]) for e in alerts] == [
        (goal.public_id, "dropped_from_context")
    ]


def test_a_summary_that_loses_a_high_importance_fact_raises_an_alert(tenant_a, session):
    first = say(tenant_a, session, "user", "Never store card numbers in logs.", event_kind="constraint")
    say(tenant_a, session, "assistant", "Understood.")
    budget_msg = say(tenant_a, session, "user", "Our budget limit is forty thousand euros.")
    register(tenant_a, session, "budget", "constraint", "Budget limit is forty thousand euros")
    late = say(tenant_a, session, "user", "We also want dark mode.", event_kind="goal")
    card = TrackedFact.objects.get(session=session, source_seq=first.seq)
    warnings = decay.facts_after_summary(
        tenant=tenant_a,
        session=session,
        summary_text="The user set a forty thousand euro budget limit.",
        folded_seqs=list(range(1, budget_msg.seq + 1)),
    )
    assert len(warnings) == 1 and card.public_id in warnings[0]
    alerts = events(tenant_a, "fact.alert")
    assert [(e.payload["fact"], e.payload["reason"]) for e in alerts] == [
        (card.public_id, "lost_from_summary")
    ]
    assert late.seq > budget_msg.seq  # the dark-mode goal was not folded: not checked
    assert (
        decay.facts_after_summary(
            tenant=tenant_a,
            session=session,
            summary_text="Card numbers never go to logs; budget limit forty thousand euros.",
            folded_seqs=list(range(1, budget_msg.seq + 1)),
        )
        == []
    )


def test_session_end_promotes_preferences_constraints_and_project_configuration(tenant_a, session):
    say(tenant_a, session, "user", "Start.")
    pref = register(tenant_a, session, "language", "user_preference", "Answer in French")
    constraint = register(tenant_a, session, "budget", "constraint", "Budget limit is forty thousand euros")
    config = register(tenant_a, session, "ci", "project_config", "CI runs on GitHub Actions")
    goal = register(tenant_a, session, "goal", "goal", "Ship the reporting feature")
    register(tenant_a, session, "db", "decision", "Use PostgreSQL everywhere")
    session_end(tenant=tenant_a, session=session)
    promoted = {e.payload["fact"]: e.payload for e in events(tenant_a, "fact.promoted")}
    assert set(promoted) == {pref.public_id, constraint.public_id, config.public_id, goal.public_id}
    experiences = {x.public_id: x for x in Experience.objects.filter(tenant=tenant_a)}
    for fact in (pref, constraint, config, goal):
        fact.refresh_from_db()
        assert fact.promoted_at is not None
        experience = experiences[fact.promoted_ref]
        assert experience.solution == fact.content and experience.key == fact.key
        assert experience.user_id == "u-1"
    assert experiences[promoted[pref.public_id]["experience"]].kind == "preference"
    assert experiences[promoted[goal.public_id]["experience"]].kind == "fact"
    again = decay.facts_promote(tenant=tenant_a, session=session)  # nothing is promoted twice
    assert again.promoted == [] and again.skipped == []
    assert Experience.objects.filter(tenant=tenant_a).count() == 4


def test_the_summariser_alerts_when_its_summary_loses_a_preference(tenant_a, session):
    """End to end with the real (offline) summariser: a crowded summary drops the preference."""
    from memory.models import Summary
    from memory.services.rolling_summary import session_summarise

    say(tenant_a, session, "user", "I prefer short bullet point answers.", event_kind="preference")
    preference = TrackedFact.objects.get(session=session)
    items = []
    for i in range(60):
        items += [
            MessageInput(role="user", content=f"Which library for module {i}?"),
            MessageInput(role="assistant", content=f"We decided to use library Alpha{i} for module Beta{i}."),
        ]
    messages_append(tenant=tenant_a, session=session, items=items)
    summary = session_summarise(tenant=tenant_a, session=session)
    assert summary is not None and "bullet" not in summary.text
    alerts = events(tenant_a, "fact.alert")
    assert [(e.payload["fact"], e.payload["reason"]) for e in alerts] == [
        (preference.public_id, "lost_from_summary")
    ]
    created = events(tenant_a, "summary.created")[0]
    assert len(created.payload["alerts"]) == 1 and preference.public_id in created.payload["alerts"][0]
    assert Summary.objects.filter(session=session).count() == 1


def test_the_jobs_embed_missing_facts_and_promote_a_session(tenant_a, session):
    from memory.tasks.decay import facts_embed_missing, session_facts_promote

    policy = DecayPolicy.for_tenant(tenant_a)
    policy.reference_use_embeddings = False
    policy.save()
    say(tenant_a, session, "user", "Start.")
    fact = register(tenant_a, session, "language", "user_preference", "Answer in French")
    assert fact.embedding is None
    assert facts_embed_missing() == 0  # the tenant does not use embeddings
    policy.reference_use_embeddings = True
    policy.save()
    assert facts_embed_missing() == 1
    fact.refresh_from_db()
    assert len(fact.embedding) == 384 and fact.embedding_model
    assert facts_embed_missing() == 0

    assert session_facts_promote(session.pk) == [fact.public_id]
    assert session_facts_promote(session.pk) == []  # idempotent
    assert session_facts_promote(10**9) == []  # a deleted session: nothing to do
    assert Experience.objects.filter(tenant=tenant_a, kind="preference").count() == 1
