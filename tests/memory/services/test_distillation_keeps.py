"""Distillation keeps what is worth keeping: small talk and acknowledgements never become
experiences, and a promoted fact reads as the fact it states."""

from __future__ import annotations

import json

import pytest

from memory.models import Experience, Message, Task, TaskStatus
from memory.services import decay
from memory.services.distillation.extract import extract_direct, extract_patterns, parse_summary_output
from memory.services.experiences import experiences_promote
from memory.services.sessions import MessageInput, messages_append, session_create, session_end

# The demo's last exchange (ctxapp/cli/demo_script.json).
CLOSING = "Thanks. Anything else before we close?"
FOLLOW_UPS = " ".join(
    [
        "Only the follow-ups: batch reserve_stock(), add the pool alert to the canary checklist,",
        "post-mortem tomorrow.",
    ]
)


def _messages(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(seq=n, role=role, content=text) for n, (role, text) in enumerate(pairs, start=1)]


def test_a_closing_and_its_reply_are_not_an_experience_but_a_problem_still_is():
    found = extract_patterns(
        _messages(
            ("user", "Checkout fails with a pool timeout on web-3, how do I fix it?"),
            ("assistant", "Increase the pool size to 40 and roll back the canary."),
            ("user", "That worked, thanks."),
            ("user", CLOSING),
            ("assistant", FOLLOW_UPS),
            ("user", "Ok, thanks!"),
            ("assistant", "Any time. Restart the worker if it hangs again."),
        )
    )
    assert [c.problem for c in found] == ["Checkout fails with a pool timeout on web-3, how do I fix it?"]
    assert found[0].confidence == 0.7  # confirmed by "That worked"


def test_a_task_whose_input_is_small_talk_teaches_nothing():
    assert extract_direct(Task(input=CLOSING, output=FOLLOW_UPS, status=TaskStatus.SUCCEEDED)) == []
    [kept] = extract_direct(
        Task(input="Roll back the canary", output="Rolled back.", status=TaskStatus.SUCCEEDED)
    )
    assert kept.problem == "Roll back the canary"


def test_a_models_small_talk_experience_is_dropped():
    reply = json.dumps(
        {
            "experiences": [
                {"problem": CLOSING, "solution": FOLLOW_UPS},
                {"problem": "Pool exhausted by the canary", "solution": "Roll back the canary"},
            ]
        }
    )
    assert [c.problem for c in parse_summary_output(reply)] == ["Pool exhausted by the canary"]


@pytest.mark.django_db
def test_a_promoted_fact_reads_as_a_fact(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="ops", user_id="u-1")
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="Start.")])
    decay.fact_register(
        tenant=tenant_a,
        session=session,
        key="primary_db",
        fact_type="critical_info",
        content="The primary database is db-1; db-1-replica is read-only.",
    )
    session_end(tenant=tenant_a, session=session)
    [experience] = Experience.objects.filter(tenant=tenant_a, kind="fact")
    assert experience.text == "Fact (primary_db): The primary database is db-1; db-1-replica is read-only."
    assert "Important" not in experience.text and "Solution" not in experience.text


@pytest.mark.django_db
def test_a_promoted_preference_reads_as_a_preference_and_a_task_experience_keeps_its_shape(tenant_a):
    promoted = experiences_promote(
        tenant=tenant_a, user_id="u-1", kind="preference", key="answer_style", content="Bullet points."
    ).experience
    assert promoted.text == "User preference (answer_style): Bullet points."
    task_like = Experience(problem="Pool exhausted", cause="canary", solution="Roll back")
    assert task_like.text == "Problem: Pool exhausted\nCause: canary\nSolution: Roll back"
