"""Ending sessions concurrently never deadlocks: session_end takes its locks in one order.

Two ends that promote facts of the same keys used to lock those experiences in their facts'
order and the agent's event stream at the first promotion, so each could hold what the other
needed next (PostgreSQL: "deadlock detected" on memory_eventstream). Real threads, real database.
"""

from __future__ import annotations

import functools

import pytest

from memory.models import Event, Experience, Session, SessionStatus
from memory.services import decay
from memory.services.experiences import experiences_promote
from memory.services.sessions import session_create, session_end
from tests.helpers import run_together

KEYS = ["db", "queue", "region", "runtime", "storage"]
ROUNDS = 6


def _session_with_facts(tenant, agent: str, keys: list[str]) -> Session:
    session = session_create(tenant=tenant, agent_external_id=agent, user_id="u1")
    for key in keys:  # registered in this order: promotion used to follow it
        decay.fact_register(
            tenant=tenant, session=session, key=key, fact_type="constraint", content=f"{key} is fixed"
        )
    return session


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("agents", [("bot-1", "bot-1"), ("bot-1", "bot-2")], ids=["one agent", "two agents"])
def test_concurrent_session_ends_promoting_the_same_keys_all_end(tenant_a, agents) -> None:
    for key in KEYS:  # promotion locks each key's current experience
        experiences_promote(
            tenant=tenant_a, user_id="u1", kind="constraint", key=key, content=f"{key} is fixed"
        )
    ended: list[Session] = []
    for _ in range(ROUNDS):
        pair = [
            _session_with_facts(tenant_a, agents[0], KEYS),
            _session_with_facts(tenant_a, agents[1], KEYS[::-1]),
        ]
        _, errors = run_together([functools.partial(session_end, tenant=tenant_a, session=s) for s in pair])
        assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
        ended.extend(pair)

    statuses = set(Session.objects.filter(pk__in=[s.pk for s in ended]).values_list("status", flat=True))
    assert statuses == {SessionStatus.ENDED}
    assert Event.objects.filter(tenant=tenant_a, type="session.ended").count() == 2 * ROUNDS
    # Every end promoted its facts: each key's experience names every session as a source.
    for key in KEYS:
        experience = Experience.objects.get(tenant=tenant_a, kind="constraint", key=key)
        sessions = {p.get("session") for p in experience.provenance}
        assert {s.public_id for s in ended} <= sessions
