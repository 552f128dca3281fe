"""Medium-term memory: the session digest, with real PostgreSQL.

Offline extraction fills each category from a realistic conversation; versions increment and a
run with nothing new writes nothing; the LLM path (a local fake OpenAI-compatible server: the
only double, for the remote endpoint) with fallback on malformed output; the previous digest is
offered to the same user's next session, never another user's or another tenant's."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from memory.models import Event, JobIntent, SessionDigest
from memory.services import jobs
from memory.services.context import context_build
from memory.services.session_digest import (
    DIGEST_JOB,
    context_digest_for_session,
    digests_search_candidates,
    session_digest_get,
    session_digest_update,
)
from memory.services.sessions import MessageInput, messages_append, session_create, session_end
from tests.memory.services.experience_servers import FakeOpenAI

pytestmark = pytest.mark.django_db

CONVERSATION = [
    ("user", "Hi! I want to migrate our billing service from MySQL to PostgreSQL this quarter."),
    ("assistant", "Sure, happy to help with that."),
    ("user", "I prefer small, reversible steps over a big-bang cutover."),
    ("user", "The migration must finish before March 31 and we cannot take more than 5 minutes of downtime."),
    ("assistant", "Then logical replication is the safest route. We decided to use pglogical for the sync."),
    ("user", "Good. I ran the schema check and found that three tables use MySQL ENUM columns."),
    (
        "assistant",
        "The root cause of the failed dry run was the ENUM type, which PostgreSQL maps differently.",
    ),
    ("assistant", "I have finished converting the schema; the dry run passed on staging."),
    ("user", "Should we also move the reporting replicas?"),
]


def talk(tenant, session, turns):
    messages_append(
        tenant=tenant, session=session, items=[MessageInput(role=role, content=text) for role, text in turns]
    )


def texts(digest, category):
    return [item["text"] for item in digest.content[category]]


@pytest.fixture
def session(tenant_a):
    return session_create(tenant=tenant_a, agent_external_id="planner", user_id="ana")


def test_offline_extraction_fills_every_category_from_a_real_conversation(tenant_a, session):
    talk(tenant_a, session, CONVERSATION)
    digest = session_digest_update(tenant=tenant_a, session=session)
    assert digest is not None and digest.version == 1 and digest.method == "offline"
    assert any("migrate our billing service" in t for t in texts(digest, "goals"))
    assert any("prefer small, reversible steps" in t for t in texts(digest, "preferences"))
    assert any("must finish before March 31" in t for t in texts(digest, "constraints"))
    assert any("decided to use pglogical" in t for t in texts(digest, "decisions"))
    assert any("found that three tables use MySQL ENUM" in t for t in texts(digest, "findings"))
    assert any("finished converting the schema" in t for t in texts(digest, "progress"))
    assert texts(digest, "open_questions") == ["Should we also move the reporting replicas?"]
    assert "Sure, happy to help" not in digest.text  # small talk is not kept
    assert digest.content["goals"][0]["seq"] == 1 and digest.covers_up_to_seq == len(CONVERSATION)
    assert digest.text.startswith("Goals:\n- ")
    event = Event.objects.get(tenant=tenant_a, type="digest.updated")
    assert event.payload["version"] == 1 and event.payload["counts"]["decisions"] == 1


def test_versions_increment_keep_history_and_an_idle_run_writes_nothing(tenant_a, session):
    talk(tenant_a, session, CONVERSATION)
    first = session_digest_update(tenant=tenant_a, session=session)
    assert session_digest_update(tenant=tenant_a, session=session) is None  # nothing new
    talk(tenant_a, session, [("assistant", "Moving the replicas later is fine; the schema is done.")])
    talk(tenant_a, session, [("user", "Ok. We agreed to switch to pgbouncer for pooling.")])
    second = session_digest_update(tenant=tenant_a, session=session)
    assert second is not None and second.version == 2
    # the question was taken up by an assistant message: no longer open
    assert texts(second, "open_questions") == []
    assert any("pgbouncer" in t for t in texts(second, "decisions"))
    assert any("pglogical" in t for t in texts(second, "decisions"))  # earlier items carried over
    assert session_digest_get(tenant=tenant_a, session=session).version == 2
    assert session_digest_get(tenant=tenant_a, session=session, version=1).text == first.text
    talk(tenant_a, session, [("assistant", "Okay.")])  # nothing worth keeping: no new version
    assert session_digest_update(tenant=tenant_a, session=session) is None
    assert SessionDigest.objects.filter(session=session).count() == 2
    assert Event.objects.filter(tenant=tenant_a, type="digest.updated").count() == 2


@pytest.fixture
def chat(settings) -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, summariser_url=server.url, summariser_retries=1)
    yield server
    server.close()


def test_the_llm_endpoint_writes_the_digest_as_validated_json(tenant_a, session, chat):
    talk(tenant_a, session, CONVERSATION)
    reply = {
        "goals": ["Migrate billing from MySQL to PostgreSQL this quarter"],
        "decisions": ["Use pglogical logical replication"],
        "findings": ["Three tables use ENUM columns"],
        "preferences": ["Small reversible steps"],
        "constraints": ["Done by March 31", "At most 5 minutes downtime"],
        "progress": ["Schema converted; staging dry run passed"],
        "open_questions": ["Move the reporting replicas too?"],
    }
    chat.chat_replies = ["```json\n" + json.dumps(reply) + "\n```"]
    digest = session_digest_update(tenant=tenant_a, session=session)
    assert digest.method == "llm" and digest.error == ""
    assert texts(digest, "constraints") == ["Done by March 31", "At most 5 minutes downtime"]
    assert digest.content["decisions"][0]["seq"] is None
    [request] = chat.chat_requests
    assert "open_questions" in request["messages"][0]["content"]
    assert "pglogical" in request["messages"][1]["content"]  # the transcript was sent


def test_malformed_llm_output_is_retried_then_falls_back_to_offline(tenant_a, session, chat):
    talk(tenant_a, session, CONVERSATION)
    chat.chat_replies = ["Sure! Here is the digest: goals are migration.", '{"goals": "not a list"}']
    digest = session_digest_update(tenant=tenant_a, session=session)
    assert len(chat.chat_requests) == 2  # one retry with a correction message
    assert "not valid" in chat.chat_requests[1]["messages"][-1]["content"]
    assert digest.method == "llm_fallback"
    assert "no JSON object" in digest.error and "not a list of strings" in digest.error
    assert any("pglogical" in t for t in texts(digest, "decisions"))  # the offline extractor wrote it
    assert Event.objects.get(type="digest.updated").payload["method"] == "llm_fallback"


def test_an_unknown_key_from_the_llm_is_malformed(tenant_a, session, chat):
    talk(tenant_a, session, CONVERSATION)
    chat.chat_replies = ['{"goals": [], "mood": ["happy"]}', '{"todo": []}']
    digest = session_digest_update(tenant=tenant_a, session=session)
    assert digest.method == "llm_fallback" and "unknown key(s): mood" in digest.error


def test_the_previous_digest_is_offered_to_the_same_users_next_session(tenant_a, session):
    talk(tenant_a, session, CONVERSATION)
    session_digest_update(tenant=tenant_a, session=session)
    session_end(tenant=tenant_a, session=session)
    following = session_create(tenant=tenant_a, agent_external_id="planner", user_id="ana")
    built = context_build(tenant=tenant_a, session=following, next_input="Where were we with the migration?")
    [entry] = [m for m in built.manifest["items"] if m.get("source") == "previous_session_digest"]
    assert entry["included"] and entry["session"] == session.public_id
    assert entry["id"] == f"digest:{session.public_id}:v1"
    prompt = "\n".join(str(m["content"]) for m in built.messages)
    assert "Digest of this user's previous session" in prompt and "pglogical" in prompt
    # once the new session has its own digest, the old one is no longer offered
    talk(tenant_a, following, [("user", "I want to finish the replica move this week.")])
    session_digest_update(tenant=tenant_a, session=following)
    assert context_digest_for_session(tenant=tenant_a, session=following) is None


def test_another_users_or_tenants_digest_is_never_offered(tenant_a, tenant_b, session):
    talk(tenant_a, session, CONVERSATION)
    session_digest_update(tenant=tenant_a, session=session)
    other_user = session_create(tenant=tenant_a, agent_external_id="planner", user_id="bruno")
    anonymous = session_create(tenant=tenant_a, agent_external_id="planner")
    same_name_elsewhere = session_create(tenant=tenant_b, agent_external_id="planner", user_id="ana")
    for target, tenant in [(other_user, tenant_a), (anonymous, tenant_a), (same_name_elsewhere, tenant_b)]:
        assert context_digest_for_session(tenant=tenant, session=target) is None
        built = context_build(tenant=tenant, session=target, next_input="Where were we?")
        assert not [m for m in built.manifest["items"] if m.get("source") == "previous_session_digest"]
        assert "pglogical" not in "\n".join(str(m["content"]) for m in built.messages)


def test_digests_are_searchable_by_full_text_within_the_tenant(tenant_a, tenant_b, session):
    talk(tenant_a, session, CONVERSATION)
    session_digest_update(tenant=tenant_a, session=session)
    [hit] = digests_search_candidates(tenant=tenant_a, query="which replication tool did we pick? pglogical")
    assert hit["session"] == session.public_id and hit["version"] == 1 and "pglogical" in hit["text"]
    assert digests_search_candidates(tenant=tenant_a, query="pglogical", user_id="bruno") == []
    assert digests_search_candidates(tenant=tenant_b, query="pglogical") == []


def test_ending_a_session_queues_its_digest_as_a_job_with_a_recorded_outcome(tenant_a, session):
    talk(tenant_a, session, CONVERSATION)
    session_end(tenant=tenant_a, session=session)
    [intent] = JobIntent.objects.filter(kind=DIGEST_JOB)  # written with the session's end
    assert intent.tenant_id == tenant_a.pk and intent.payload == {"session": session.pk}
    assert jobs.job_run(intent_id=intent.pk) == "done"  # what the worker runs
    assert session_digest_get(tenant=tenant_a, session=session).version == 1
    intent.refresh_from_db()
    assert intent.status == "done" and intent.result == {"session": session.public_id, "version": 1}


def test_the_summarisation_job_maintains_the_digest(tenant_a, session):
    from memory.tasks import context as tasks

    talk(tenant_a, session, CONVERSATION)
    tasks.session_summarise(session.pk)  # the Celery task body, run here
    digest = session_digest_get(tenant=tenant_a, session=session)
    assert digest.version == 1 and any("pglogical" in t for t in texts(digest, "decisions"))
    tasks.session_summarise(session.pk)  # nothing new: no new version
    assert SessionDigest.objects.filter(session=session).count() == 1


def test_a_long_backlog_is_read_in_bounded_steps(tenant_a, session, monkeypatch):
    from memory.services import session_digest as service

    monkeypatch.setattr(service, "MAX_ROWS_PER_UPDATE", 5)
    talk(tenant_a, session, CONVERSATION)  # 9 messages
    first = session_digest_update(tenant=tenant_a, session=session)
    assert first.covers_up_to_seq == 5  # the next step is queued:
    assert JobIntent.objects.filter(kind=DIGEST_JOB, payload={"session": session.pk}).count() == 1
    second = session_digest_update(tenant=tenant_a, session=session)
    assert second.version == 2 and second.covers_up_to_seq == 9
    assert any("finished converting the schema" in t for t in texts(second, "progress"))
