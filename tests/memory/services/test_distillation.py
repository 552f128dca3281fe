"""Distillation: light path on task finish, full path (direct + pattern + LLM summary through a
local OpenAI-compatible chat server), robust to malformed model output."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from memory.models import Event, Experience, MessageRole
from memory.services.distillation import TaskNotFinished, task_distill_full, task_distill_light
from memory.services.sessions import MessageInput, messages_append, session_create, task_create, task_update
from tests.memory.services.experience_servers import FakeOpenAI

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(settings) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, summariser_url=server.url, summariser_retries=2)
    yield server
    server.close()


def make_task(tenant, *, tier="normal", status="succeeded", distill=None, conversation=()):
    session = session_create(tenant=tenant, agent_external_id="agent-1", user_id="u1")
    if conversation:
        messages_append(
            tenant=tenant,
            session=session,
            items=[MessageInput(role=role, content=content) for role, content in conversation],
        )
    metadata = {"distill": distill} if distill else {}
    task = task_create(
        tenant=tenant,
        session=session,
        input="Deploy fails with CrashLoopBackOff",
        value_tier=tier,
        metadata=metadata,
    )
    return task_update(
        tenant=tenant, task=task, status=status, output="Root cause: missing DATABASE_URL. Added it."
    )


CONVERSATION = [
    (MessageRole.USER, "The nightly export job fails with a timeout error, any idea?"),
    (MessageRole.ASSISTANT, "The cause was the missing index on exports.created_at; add it and rerun."),
    (MessageRole.USER, "Thanks, that worked!"),
    (MessageRole.USER, "ok now write me a poem"),
    (MessageRole.ASSISTANT, "Roses are red."),
]


def distilled(tenant):
    return list(Event.objects.filter(tenant=tenant, type="memory.distilled").order_by("pk"))


def test_a_low_value_task_takes_the_light_path_when_it_finishes(tenant_a):
    task = make_task(tenant_a, tier="low")
    [experience] = Experience.objects.filter(tenant=tenant_a)
    assert experience.extraction_method == "direct" and experience.source_task_id == task.pk
    assert experience.problem == "Deploy fails with CrashLoopBackOff"
    assert experience.cause == "missing DATABASE_URL" and experience.confidence == 0.7
    assert experience.user_id == "u1" and experience.scope == "user"
    assert experience.agent == "agent-1"  # the agent whose task it was: bound keys are scoped by it
    [event] = distilled(tenant_a)
    assert event.payload["path"] == "light" and event.payload["experiences"] == [experience.public_id]


def test_a_failed_task_is_kept_as_a_low_confidence_cause(tenant_a):
    make_task(tenant_a, tier="low", status="failed")
    [experience] = Experience.objects.filter(tenant=tenant_a)
    assert experience.confidence == 0.3 and experience.solution == ""
    assert experience.cause.startswith("Attempt failed:")


def test_light_distillation_of_an_unfinished_task_is_refused(tenant_a):
    task = task_create(tenant=tenant_a, input="x")
    with pytest.raises(TaskNotFinished):
        task_distill_light(tenant=tenant_a, task=task)
    assert not Experience.objects.exists()


def test_full_path_extracts_direct_and_pattern_with_message_provenance(tenant_a):
    task = make_task(tenant_a, distill="none", conversation=CONVERSATION)
    results = task_distill_full(tenant=tenant_a, task=task)
    by_method = {r.experience.extraction_method: r.experience for r in results}
    assert set(by_method) == {"direct", "pattern"}
    assert {e.agent for e in by_method.values()} == {"agent-1"}
    pattern = by_method["pattern"]
    assert pattern.problem.startswith("The nightly export job fails")
    assert pattern.cause.startswith("the missing index on exports")
    assert pattern.confidence == 0.7  # confirmed by the user
    assert pattern.provenance[0]["message_seqs"] == [1, 2, 3]
    assert pattern.provenance[0]["session"] == task.session.public_id
    event = distilled(tenant_a)[-1]
    assert event.payload["path"] == "full"
    assert event.payload["extractors"]["pattern"] == 1
    assert event.payload["extractors"]["summary"]["status"] == "not_configured"
    # Re-running adds nothing.
    assert {r.outcome for r in task_distill_full(tenant=tenant_a, task=task)} == {"unchanged"}
    assert Experience.objects.filter(tenant=tenant_a).count() == 2


def test_llm_summary_retries_malformed_output_then_succeeds(tenant_a, chat):
    chat.chat_replies = [
        "Sure! Here are the experiences: problem was an index",
        "```json\n" + json.dumps({"experiences": [{
            "problem": "Export job times out", "cause": "no index on created_at",
            "solution": "Create the index", "confidence": 0.9, "message_seqs": [1, 2],
        }]}) + "\n```",
    ]  # fmt: skip
    task = make_task(tenant_a, distill="none", conversation=CONVERSATION)
    results = task_distill_full(tenant=tenant_a, task=task)
    [summary] = [r.experience for r in results if r.experience.extraction_method == "summary"]
    assert (summary.problem, summary.confidence) == ("Export job times out", 0.9)
    assert summary.provenance[0]["message_seqs"] == [1, 2]
    assert len(chat.chat_requests) == 2
    assert "not valid" in chat.chat_requests[1]["messages"][-1]["content"]
    report = distilled(tenant_a)[-1].payload["extractors"]["summary"]
    assert report["status"] == "ok" and report["attempts"] == 2 and report["count"] == 1


def test_llm_summary_that_stays_malformed_falls_back_and_says_so(tenant_a, chat):
    chat.chat_replies = ["not json", '{"experiences": [{"cause": "no problem field"}]}', '{"items": []}']
    task = make_task(tenant_a, distill="none", conversation=CONVERSATION)
    results = task_distill_full(tenant=tenant_a, task=task)
    assert {r.experience.extraction_method for r in results} == {"direct", "pattern"}
    assert len(chat.chat_requests) == 3
    report = distilled(tenant_a)[-1].payload["extractors"]["summary"]
    assert report["status"] == "fallback" and report["count"] == 0
    assert len(report["errors"]) == 3 and all("malformed" in e for e in report["errors"])
