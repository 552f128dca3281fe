"""A build and a job that write to one agent's event stream never deadlock over an experience.

A worker job may append an event (so it holds its agent's event stream until it commits) and
then lock an experience. A build that recalls that experience must not hold it locked while it
waits for the same stream: when the build counted the use inside its transaction, before its own
`context.built` event, the two waited on each other until PostgreSQL killed one ("deadlock
detected": the build answered 503 in the soak drill)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from memory.models import Experience
from memory.services import recorder
from memory.services.context import context_build
from memory.services.experiences import experience_create
from memory.services.sessions import session_create

pytestmark = pytest.mark.django_db(transaction=True)

DEADLINE_SECONDS = 30.0


def _blocked_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
        return int(cursor.fetchone()[0])


def test_a_build_recalling_an_experience_a_job_locks_next_does_not_deadlock(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="agent-1", user_id="u1")
    experience = experience_create(
        tenant=tenant_a,
        problem="Nginx returns 502 Bad Gateway",
        solution="bind the upstream to 0.0.0.0",
        agent="agent-1",
    ).experience
    holding = threading.Event()
    errors: list[BaseException] = []

    def job() -> None:
        try:
            with transaction.atomic():
                recorder.event_append(tenant=tenant_a, type="test.job", session=session, payload={})
                holding.set()
                # Until the build waits for this stream (or the deadline: then it never did).
                deadline = time.monotonic() + DEADLINE_SECONDS
                while _blocked_backends() == 0 and time.monotonic() < deadline:
                    time.sleep(0.02)
                list(Experience.objects.select_for_update().filter(pk=experience.pk))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=job)
    worker.start()
    try:
        assert holding.wait(DEADLINE_SECONDS)
        built = context_build(tenant=tenant_a, session=session, next_input="nginx 502 bad gateway")
    finally:
        worker.join(DEADLINE_SECONDS)
    assert not worker.is_alive()
    assert errors == []
    recalled = [
        item["id"] for item in built.manifest["items"] if item["kind"] == "memory" and item["included"]
    ]
    assert recalled == [experience.public_id]
    experience.refresh_from_db()
    assert experience.use_count == 1
