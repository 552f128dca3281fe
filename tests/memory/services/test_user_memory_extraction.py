"""Extraction of user memories: the offline rules, the one-call model path and its fallback, the
coalesced job an append queues without waiting for it, and supersede when a fact changes."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings as django_settings

from memory.models import Event, JobIntent, JobStatus, UserMemory, UserMemoryExtraction
from memory.services.sessions import MessageInput, messages_append, session_open
from memory.services.user_memory.extraction import (
    EXTRACT_JOB,
    Turn,
    is_small_talk,
    offline_candidates,
    parse_model_output,
    session_memories_extract,
)
from memory.services.user_memory.store import memories_of
from tests.memory.services.experience_servers import FakeOpenAI

T0 = datetime(2025, 3, 1, 9, 0, tzinfo=UTC)


def _turns(*pairs: tuple[str, str]) -> list[Turn]:
    return [Turn(seq, role, text) for seq, (role, text) in enumerate(pairs, start=1)]


# --- the offline rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Thanks. Anything else before we close?",
        "Ok, thanks!",
        "Got it.",
        "Thanks, that's helpful.",
        "Good idea, thanks.",
        "Will do.",
        "Merry Christmas!",
        "No, that's all, thanks.",
        "Great, thanks.",
    ],
)
def test_small_talk_and_acknowledgements_never_become_memories(text):
    assert is_small_talk(text)
    assert offline_candidates(_turns(("user", text))) == []


def test_user_statements_become_memories_with_subject_type_and_source():
    found = offline_candidates(
        _turns(
            ("user", "I'm a product designer at Lumen Studio and I live in Portland."),
            ("assistant", "Nice! I live in Lisbon and I hate cilantro."),
            ("user", "I hate cilantro, and I'm allergic to peanuts."),
            ("user", "We adopted a dog from the shelter, a mutt called Pepper."),
        )
    )
    by_subject = {c.subject: c for c in found}
    assert by_subject["work.employer"].text == "Works at Lumen Studio"
    assert by_subject["work.role"].text == "Works as a product designer"
    assert by_subject["home.city"].text == "Lives in Portland"
    assert by_subject["home.city"].seq == 1  # the assistant's own "I live in Lisbon" is not the user's
    assert by_subject["preference.cilantro"].memory_type == "preference"
    assert by_subject["preference.cilantro"].seq == 3
    assert by_subject["constraint.allergy"].text == "Allergic to peanuts"
    assert by_subject["pet.dog.name"].text == "Has a dog called Pepper"
    assert all(0 < c.confidence <= 1 for c in found)


def test_a_changed_plan_keeps_its_subject_so_it_can_supersede():
    known = {"plan.course": "Plan: take a German course in September"}
    [changed] = offline_candidates(
        _turns(("user", "Changed my mind about German: I'm doing Italian instead.")), current=known
    )
    assert (changed.subject, changed.text) == ("plan.course", "Plan: Italian instead")
    [cancelled] = offline_candidates(_turns(("user", "Sad update: we cancelled the Japan trip.")))
    assert cancelled.subject == "plan.trip" and cancelled.text.startswith("Cancelled")


# --- the model's reply ---------------------------------------------------------------------------


def test_a_model_reply_is_validated_field_by_field():
    good = json.dumps(
        {"memories": [{"subject": "home.city", "type": "profile", "text": "Lives in Denver", "turn": 3}]}
    )
    [candidate] = parse_model_output(good, user_seqs={1, 3})
    assert (candidate.subject, candidate.seq, candidate.confidence) == ("home.city", 3, 0.7)
    bad = [
        "not json",
        json.dumps({"memory": []}),
        json.dumps({"memories": [{"subject": "Home City", "type": "profile", "text": "x", "turn": 1}]}),
        json.dumps({"memories": [{"subject": "home.city", "type": "gossip", "text": "x", "turn": 1}]}),
        json.dumps({"memories": [{"subject": "home.city", "type": "profile", "text": "", "turn": 1}]}),
        json.dumps({"memories": [{"subject": "home.city", "type": "profile", "text": "x", "turn": 2}]}),
        json.dumps(
            {"memories": [{"subject": "home.city", "type": "fact", "text": "x", "turn": 1, "confidence": 7}]}
        ),
    ]
    for reply in bad:
        with pytest.raises(ValueError):
            parse_model_output(reply, user_seqs={1, 3})


# --- the job over real sessions ------------------------------------------------------------------


def _session(tenant, user_id: str = "u-42"):
    session, _ = session_open(tenant=tenant, agent_external_id="helper", user_id=user_id)
    return session


def _say(tenant, session, *pairs: tuple[str, str], at: datetime) -> None:
    items = [
        MessageInput(role=role, content=text, occurred_at=at + timedelta(seconds=n))
        for n, (role, text) in enumerate(pairs)
    ]
    messages_append(tenant=tenant, session=session, items=items)


@pytest.mark.django_db
def test_a_changed_fact_supersedes_the_old_value_and_a_rerun_records_nothing_twice(tenant_a):
    first, later = _session(tenant_a), _session(tenant_a)
    _say(tenant_a, first, ("user", "I live in Portland, in a tiny flat."), ("assistant", "Nice."), at=T0)
    result = session_memories_extract(session=first)
    assert (result.method, result.recorded, result.covers_up_to_seq) == ("offline", {"created": 1}, 2)
    _say(tenant_a, later, ("user", "We moved to Denver last weekend!"), at=T0 + timedelta(days=90))
    session_memories_extract(session=later)

    [current] = memories_of(tenant=tenant_a, user_id="u-42").filter(subject="home.city")
    assert current.text == "Lives in Denver" and current.origin == "extracted"
    assert current.sources == [{"session": later.public_id, "seq": 1}]
    assert current.valid_from == T0 + timedelta(days=90)
    old = UserMemory.objects.get(subject="home.city", text="Lives in Portland")
    assert old.valid_to == current.valid_from and old.superseded_by_id == current.pk
    assert [m.text for m in memories_of(tenant=tenant_a, user_id="u-42", as_of=T0 + timedelta(days=1))] == [
        "Lives in Portland"
    ]
    assert Event.objects.filter(type="user_memory.superseded").count() == 1

    again = session_memories_extract(session=later)  # nothing new past the watermark
    assert (again.turns, again.recorded) == (0, {})
    assert UserMemory.objects.filter(tenant=tenant_a).count() == 2


@pytest.mark.django_db
def test_an_older_session_read_late_does_not_replace_a_newer_value(tenant_a):
    old, new = _session(tenant_a), _session(tenant_a)
    _say(tenant_a, new, ("user", "We moved to Denver!"), at=T0 + timedelta(days=30))
    session_memories_extract(session=new)
    _say(tenant_a, old, ("user", "I live in Portland."), at=T0)
    result = session_memories_extract(session=old)
    assert result.recorded == {"older": 1}
    assert [m.text for m in memories_of(tenant=tenant_a, user_id="u-42")] == ["Lives in Denver"]


@pytest.mark.django_db
def test_memories_belong_to_the_sessions_user_in_its_tenant_only(tenant_a, tenant_b):
    mine, theirs = _session(tenant_a), _session(tenant_b)
    _say(tenant_a, mine, ("user", "I live in Portland."), at=T0)
    _say(tenant_b, theirs, ("user", "I live in Oslo."), at=T0)
    session_memories_extract(session=mine)
    session_memories_extract(session=theirs)
    assert [m.text for m in memories_of(tenant=tenant_a, user_id="u-42")] == ["Lives in Portland"]
    assert [m.text for m in memories_of(tenant=tenant_b, user_id="u-42")] == ["Lives in Oslo"]


@pytest.mark.django_db
def test_appends_queue_one_coalesced_job_and_a_session_without_user_queues_none(tenant_a):
    session = _session(tenant_a)
    for n in range(5):
        _say(tenant_a, session, ("user", f"I live in Portland, note {n}."), at=T0 + timedelta(minutes=n))
    _say(tenant_a, session, ("assistant", "Noted."), at=T0 + timedelta(hours=1))
    intents = JobIntent.objects.filter(kind=EXTRACT_JOB)
    assert [(i.key, i.status) for i in intents] == [(f"session:{session.pk}", JobStatus.PENDING)]
    anonymous = _session(tenant_a, user_id="")
    _say(tenant_a, anonymous, ("user", "I live in Oslo."), at=T0)
    assert intents.count() == 1
    assert not UserMemory.objects.exists()  # the appends did not extract anything themselves


# --- the configured chat endpoint -----------------------------------------------------------------


@pytest.fixture
def chat_server(monkeypatch):
    server = FakeOpenAI()
    conf = dataclasses.replace(
        django_settings.CTXAPP,
        summariser_url=server.url,
        summariser_model="tiny",
        summariser_timeout=2.0,
        summariser_retries=1,
    )
    monkeypatch.setattr(django_settings, "CTXAPP", conf)
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.mark.django_db
def test_the_endpoint_is_called_once_per_batch_and_its_memories_recorded(tenant_a, chat_server):
    session = _session(tenant_a)
    _say(
        tenant_a,
        session,
        ("user", "Hi, quick one."),
        ("assistant", "Sure."),
        ("user", "My sister Lucia is visiting, she lives in Seville."),
        ("user", "Also I only drink decaf now."),
        at=T0,
    )
    memory = {"subject": "preference.coffee", "type": "preference", "text": "Drinks only decaf", "turn": 4}
    chat_server.chat_replies = [json.dumps({"memories": [memory]})]
    result = session_memories_extract(session=session)
    assert result.method == "model" and len(chat_server.chat_requests) == 1
    prompt = chat_server.chat_requests[0]["messages"][1]["content"]
    assert "[3 user] My sister Lucia" in prompt and "[4 user] Also I only drink decaf" in prompt
    [recorded] = memories_of(tenant=tenant_a, user_id="u-42")
    assert (recorded.text, recorded.origin, recorded.sources) == (
        "Drinks only decaf",
        "model",
        [{"session": session.public_id, "seq": 4}],
    )
    assert UserMemoryExtraction.objects.get(session=session).method == "model"


@pytest.mark.django_db
def test_a_malformed_reply_is_retried_then_the_batch_is_extracted_offline(tenant_a, chat_server):
    session = _session(tenant_a)
    _say(tenant_a, session, ("user", "I live in Portland."), at=T0)
    chat_server.chat_replies = ["sure! here you go", json.dumps({"memories": [{"subject": "BAD KEY"}]})]
    result = session_memories_extract(session=session)
    assert result.method == "model_fallback" and len(chat_server.chat_requests) == 2
    assert "malformed output" in result.errors[0]
    [recorded] = memories_of(tenant=tenant_a, user_id="u-42")
    assert (recorded.text, recorded.origin) == ("Lives in Portland", "extracted")


# --- an append never waits for extraction -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_append_returns_while_extraction_is_held_and_the_memory_appears_once_a_worker_runs(
    tenant_a, api_a, request
):
    session = api_a.post("/api/v1/sessions", {"agent": "helper", "user_id": "u-7"}, format="json").json()
    started = time.monotonic()
    response = api_a.post(
        f"/api/v1/sessions/{session['id']}/messages",
        {"role": "user", "content": "I'm allergic to peanuts, so no satay please."},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert time.monotonic() - started < 5
    # No worker yet: the job is held, pending, and the request extracted nothing itself.
    intent = JobIntent.objects.get(kind=EXTRACT_JOB)
    assert intent.status == JobStatus.PENDING
    assert not UserMemory.objects.filter(user_id="u-7").exists()

    request.getfixturevalue("celery_worker")  # now a real worker takes the queued job
    deadline = time.monotonic() + 60
    while not UserMemory.objects.filter(user_id="u-7").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    [memory] = UserMemory.objects.filter(user_id="u-7")
    assert (memory.subject, memory.text) == ("constraint.allergy", "Allergic to peanuts")
    assert memory.sources == [{"session": session["id"], "seq": 1}]
    intent.refresh_from_db()
    assert intent.status == JobStatus.DONE and intent.result is not None
    assert intent.result["method"] == "offline"
