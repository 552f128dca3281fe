"""memory_digest.digest_candidates: session digests as memory search candidates (kind `summary`)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from memory.models import Session, Tenant
from memory.models.digest import SessionDigest
from memory.services import ranking
from memory.services.embedding import embed_query
from memory.services.memory_search import SearchScope, scope_sessions
from memory.services.memory_search.digests import digest_candidates, digest_id
from memory.services.sessions import session_create

pytestmark = pytest.mark.django_db


def _digest(session: Session, version: int, text: str, **extra: object) -> SessionDigest:
    return SessionDigest.objects.create(
        tenant=session.tenant, session=session, user_id=session.user_id, version=version,
        content={"decisions": [{"text": text, "seq": 1}]}, text=text, covers_up_to_seq=version, **extra,
    )  # fmt: skip


def test_latest_digest_of_each_scope_session_matching_the_query(tenant_a: Tenant, tenant_b: Tenant) -> None:
    trip = session_create(tenant=tenant_a, agent_external_id="planner", user_id="mia")
    _digest(trip, 1, "Goals: plan the trip. Decisions: fly to Porto.")
    _digest(trip, 2, "Goals: plan the trip. Decisions: fly to Lisbon for the wedding in June.")
    later = session_create(tenant=tenant_a, agent_external_id="planner", user_id="mia")
    _digest(later, 1, "Goals: book a hotel. Preferences: quiet rooms.")
    other_user = session_create(tenant=tenant_a, agent_external_id="planner", user_id="zoe")
    _digest(other_user, 1, "Decisions: the wedding venue is in Madrid.")
    foreign = session_create(tenant=tenant_b, agent_external_id="planner", user_id="mia")
    _digest(foreign, 1, "Decisions: the wedding is in Rome.")

    pks, _ = scope_sessions(tenant=tenant_a, scope=SearchScope(session=later.public_id))
    _, vector = embed_query("where is the wedding")
    found = digest_candidates(tenant=tenant_a, query="where is the wedding", session_pks=pks, vector=vector)

    # only mia's sessions of tenant A, only the latest version, only digests that share a term
    assert [c.key for c in found] == [f"summary:{digest_id(session_id=trip.public_id, version=2)}"]
    hit = found[0]
    assert hit.kind == "summary" and "Lisbon" in hit.text and "Porto" not in hit.text
    assert hit.group is None and hit.position is None and hit.occurred_at is not None
    assert isinstance(hit.dense, float) and -1.0 <= hit.dense <= 1.0  # the real model's cosine

    # the whole tenant (None) reaches every user's digests, never another tenant's
    tenant_wide = digest_candidates(tenant=tenant_a, query="wedding", session_pks=None)
    assert {c.text for c in tenant_wide} == {
        "Goals: plan the trip. Decisions: fly to Lisbon for the wedding in June.",
        "Decisions: the wedding venue is in Madrid.",
    }
    assert all(c.dense is None for c in tenant_wide)  # no query vector: no dense signal
    assert digest_candidates(tenant=tenant_a, query="wedding", session_pks=[]) == []
    assert digest_candidates(tenant=tenant_a, query="?!", session_pks=None) == []
    assert digest_candidates(tenant=tenant_a, query="submarine", session_pks=None) == []

    # they rank with the other kinds through ranking.rank, as memory_search does
    ranked = ranking.rank(
        query="wedding", candidates=tenant_wide, plan=ranking.DEFAULT_PLAN,
    )  # fmt: skip
    assert {r.candidate.key for r in ranked} == {c.key for c in tenant_wide}


def test_time_range_and_limit(tenant_a: Tenant) -> None:
    now = timezone.now()
    old = session_create(tenant=tenant_a, agent_external_id="planner", user_id="mia")
    _digest(old, 1, "Findings: the deploy broke on Friday.", created_at=now - timedelta(days=30))
    new = session_create(tenant=tenant_a, agent_external_id="planner", user_id="mia")
    _digest(new, 1, "Findings: the deploy broke again, the deploy needs a ticket.", created_at=now)

    recent = digest_candidates(
        tenant=tenant_a, query="deploy", session_pks=None, time_from=now - timedelta(days=1)
    )
    assert [c.text for c in recent] == ["Findings: the deploy broke again, the deploy needs a ticket."]
    older = digest_candidates(
        tenant=tenant_a, query="deploy", session_pks=None, time_to=now - timedelta(days=1)
    )
    assert [c.text for c in older] == ["Findings: the deploy broke on Friday."]
    both = digest_candidates(tenant=tenant_a, query="deploy broke", session_pks=None)
    assert len(both) == 2 and both[0].text.startswith("Findings: the deploy broke again")  # best match first
    assert len(digest_candidates(tenant=tenant_a, query="deploy", session_pks=None, limit=1)) == 1


def test_memory_search_finds_an_earlier_sessions_digest(tenant_a: Tenant, tenant_b: Tenant) -> None:
    from memory.services.memory_search import memory_search

    trip = session_create(tenant=tenant_a, agent_external_id="planner", user_id="mia")
    _digest(trip, 1, "Decisions: fly to Lisbon for the wedding in June.")
    later = session_create(tenant=tenant_a, agent_external_id="planner", user_id="mia")
    result = memory_search(
        tenant=tenant_a, query="where is the wedding", scope=SearchScope(user_id="mia"), kinds=["summary"],
        limit=5,
    )  # fmt: skip
    assert [hit.id for hit in result.results] == [digest_id(session_id=trip.public_id, version=1)]
    assert later.public_id  # the new session has no digest of its own yet
    foreign = memory_search(
        tenant=tenant_b, query="where is the wedding", scope=SearchScope(user_id="mia"), kinds=["summary"],
        limit=5,
    )  # fmt: skip
    assert foreign.results == []
