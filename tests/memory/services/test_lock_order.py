"""Writers that lock rows and append to an event stream never deadlock each other: each takes
its streams before the rows (recorder.streams_lock's rule), or locks no row at all.

A build that recalls an experience: a worker job may append an event (so it holds its agent's
event stream until it commits) and then lock an experience. When the build counted the use
inside its transaction, before its own `context.built` event, the two waited on each other until
PostgreSQL killed one ("deadlock detected": the build answered 503 in the soak drill); the count
now runs after commit.

Two jobs of one agent: a distillation stores its experiences one by one in one transaction (the
first one's event holds the stream) and locks a stored experience it repeats, to merge into it;
the embedding job locked the rows it embeds, then appended their events to the same stream.
User memories: their events go to the tenant's stream; an extraction records its subjects one
by one in one transaction, and a correction through the API locked its subject, then waited for
the stream. Each test drives its interleaving with two connections: `deadlock detected` on the
old order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from django.db import connection, connections, transaction

from memory.models import EmbeddingStatus, Experience, UserMemory
from memory.services import recorder
from memory.services.context import context_build
from memory.services.experiences import experience_create
from memory.services.experiences.embed import experiences_embed
from memory.services.sessions import session_create
from memory.services.user_memory.memories import MemorySuperseded, user_memory_update, user_scope
from memory.services.user_memory.store import memory_record

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE_SECONDS = 30.0
T = TypeVar("T")


def _blocked_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return int(cursor.fetchone()[0])


def interleaved(job: Callable[[Callable[[], None]], None], here: Callable[[], T]) -> T:
    """Run `job` in a thread, on a connection of its own, and `here` on this one, interleaved:
    `job` calls the function it is given once it holds what it holds; that returns once another
    transaction waits for a lock (`here`, or the deadline: then it never did), and `job` goes on.
    Returns what `here` returned; fails on what `job` raised (a deadlock, for one)."""
    holding = threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        holding.set()
        deadline = time.monotonic() + DEADLINE_SECONDS
        while _blocked_backends() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)

    def body() -> None:
        try:
            job(hold)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=body)
    worker.start()
    try:
        assert holding.wait(DEADLINE_SECONDS)
        result = here()
    finally:
        worker.join(DEADLINE_SECONDS)
    assert not worker.is_alive()
    assert errors == []
    return result


def test_a_build_recalling_an_experience_a_job_locks_next_does_not_deadlock(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="agent-1", user_id="u1")
    experience = experience_create(
        tenant=tenant_a,
        problem="Nginx returns 502 Bad Gateway",
        solution="bind the upstream to 0.0.0.0",
        agent="agent-1",
    ).experience

    def job(hold: Callable[[], None]) -> None:
        with transaction.atomic():
            recorder.event_append(tenant=tenant_a, type="test.job", session=session, payload={})
            hold()  # until the build waits for this stream
            list(Experience.objects.select_for_update().filter(pk=experience.pk))

    built = interleaved(
        job, lambda: context_build(tenant=tenant_a, session=session, next_input="nginx 502 bad gateway")
    )
    recalled = [
        item["id"] for item in built.manifest["items"] if item["kind"] == "memory" and item["included"]
    ]
    assert recalled == [experience.public_id]
    experience.refresh_from_db()
    assert experience.use_count == 1


def test_a_distillation_repeating_an_experience_the_embedding_job_holds_does_not_deadlock(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="agent-1", user_id="u1")
    nginx = {"problem": "Nginx returns 502 Bad Gateway", "solution": "bind the upstream to 0.0.0.0"}
    stored = experience_create(tenant=tenant_a, agent="agent-1", source_session=session, **nginx).experience
    assert Experience.objects.get(pk=stored.pk).embedding_status == EmbeddingStatus.PENDING
    outcomes: list[str] = []

    def distillation(hold: Callable[[], None]) -> None:
        with transaction.atomic():
            first = experience_create(
                tenant=tenant_a, problem="Postgres refuses connections", solution="raise max_connections",
                agent="agent-1", source_session=session,
            )  # fmt: skip
            outcomes.append(first.outcome)
            hold()  # until the embedding job waits for this stream
            again = experience_create(
                tenant=tenant_a, agent="agent-1", source_session=session, source={"run": "second"}, **nginx
            )
            outcomes.append(again.outcome)

    embedded = interleaved(distillation, lambda: experiences_embed(experience_ids=[stored.pk]))
    assert outcomes == ["created", "merged"]
    assert embedded == 1
    stored.refresh_from_db()
    assert stored.embedding_status == EmbeddingStatus.COMPLETED
    assert stored.merge_count == 1 and len(stored.provenance) == 2  # the repeat is folded in once


def test_an_extraction_recording_a_subject_an_update_holds_does_not_deadlock(tenant_a):
    lives = memory_record(tenant=tenant_a, user_id="u1", subject="home.city", text="Lives in Portland").memory

    def extraction(hold: Callable[[], None]) -> None:
        with transaction.atomic():
            memory_record(tenant=tenant_a, user_id="u1", subject="diet", text="Vegetarian")
            hold()  # until the correction waits for the tenant's stream
            memory_record(tenant=tenant_a, user_id="u1", subject="home.city", text="Lives in Denver")

    def correction() -> BaseException | None:
        try:
            user_memory_update(
                scope=user_scope(tenant=tenant_a, user_id="u1"), memory_id=lives.public_id, confidence=0.9
            )
        except MemorySuperseded as exc:  # the extraction superseded it first: a 409, not a deadlock
            return exc
        return None

    interleaved(extraction, correction)
    current = UserMemory.objects.get(
        tenant=tenant_a, user_id="u1", subject="home.city", valid_to__isnull=True
    )
    assert current.text == "Lives in Denver"
