"""The context engine's memory slot: ranking 0.5·similarity + 0.3·confidence + 0.2·scope
(+ feedback), top N within a character budget, user scope, mark used."""

from __future__ import annotations

import pytest

from memory.models import Experience, ExperiencePolicy
from memory.services.experience_search import (
    experiences_for_context,
    experiences_mark_used,
    experiences_search,
)
from memory.services.experiences import experience_create, experience_feedback, experiences_embed
from memory.services.sessions import session_create

pytestmark = pytest.mark.django_db

DB_SLOW = ("Postgres query on orders timed out", "add a composite index on (customer_id, created_at)")
DB_SLOW_2 = ("Database report query very slow for customer orders", "ran ANALYZE and raised work_mem")
NGINX = ("Nginx returns 502 Bad Gateway", "bind the upstream to 0.0.0.0")


def make(tenant, pair, **kwargs):
    # Recorded by the session's agent: a build reads only its own agent's experiences by default
    # (tests/memory/services/test_sharing.py).
    kwargs.setdefault("agent", "agent-1")
    return experience_create(tenant=tenant, problem=pair[0], solution=pair[1], **kwargs).experience


def embed(tenant):
    experiences_embed(
        experience_ids=list(Experience.objects.filter(tenant=tenant).values_list("pk", flat=True))
    )


@pytest.fixture
def session(tenant_a):
    return session_create(tenant=tenant_a, agent_external_id="agent-1", user_id="u1")


def test_the_slot_ranks_relevant_memories_and_leaves_out_unrelated_ones(tenant_a, session):
    slow, slow2, nginx = (
        make(tenant_a, DB_SLOW, confidence=0.9),
        make(tenant_a, DB_SLOW_2, confidence=0.2),
        make(tenant_a, NGINX),
    )
    embed(tenant_a)
    memories = experiences_for_context(
        tenant=tenant_a,
        session=session,
        query="orders query is really slow in postgres",
        limit=5,
        max_chars=2000,
    )
    ids = [m.experience_id for m in memories]
    assert ids[0] == slow.public_id and nginx.public_id not in ids
    top = memories[0]
    assert top.score == pytest.approx(0.5 * top.similarity + 0.3 * 0.9 + 0.2 * 0.5, abs=1e-4)
    assert top.text.startswith("Problem: Postgres query on orders timed out")
    assert slow2.public_id in ids


def test_the_slot_respects_limit_and_characters(tenant_a, session):
    for problem, fix in [
        ("Postgres query timed out on orders", "added a composite index. "),
        ("Postgres replication lag on the replica", "raised wal_keep_size. "),
        ("Postgres connection pool exhausted", "put pgbouncer in front. "),
        ("Postgres disk full because of the orders table", "vacuumed and archived old rows. "),
    ]:
        make(tenant_a, (problem, fix * 12))
    embed(tenant_a)
    query = "postgres problem"
    assert (
        len(experiences_for_context(tenant=tenant_a, session=session, query=query, limit=2, max_chars=5000))
        == 2
    )
    fitted = experiences_for_context(tenant=tenant_a, session=session, query=query, limit=5, max_chars=800)
    assert len(fitted) == 2 and sum(len(m.text) for m in fitted) <= 800


def test_user_scope_ranks_higher_and_stays_with_its_user(tenant_a, session):
    tenant_wide = make(tenant_a, DB_SLOW, confidence=0.5)
    own = make(
        tenant_a, ("Postgres orders query times out", "use the read replica for reports"), user_id="u1"
    )
    other = make(tenant_a, ("Postgres orders query times out badly", "kill long queries"), user_id="u2")
    embed(tenant_a)
    memories = experiences_for_context(
        tenant=tenant_a, session=session, query="postgres orders query timeout", limit=5, max_chars=2000
    )
    ids = [m.experience_id for m in memories]
    assert own.public_id in ids and tenant_wide.public_id in ids and other.public_id not in ids
    assert next(m for m in memories if m.experience_id == own.public_id).scope_priority == 1.0


def test_feedback_is_off_by_default(tenant_a, session):
    # bench/bench_feedback.py: a query-independent vote lowered held-out ranking at every weight.
    experience = make(tenant_a, DB_SLOW_2, confidence=0.5)
    embed(tenant_a)

    def score() -> float:
        found = experiences_for_context(
            tenant=tenant_a, session=session, query="slow postgres orders query", limit=5, max_chars=2000
        )
        return next(m.score for m in found if m.experience_id == experience.public_id)

    before = score()
    experience_feedback(tenant=tenant_a, experience=experience, helpful=True)
    assert score() == pytest.approx(before, abs=1e-6)


def test_helpful_feedback_lifts_an_experience_when_the_tenant_weighs_it(tenant_a, session):
    ExperiencePolicy.objects.update_or_create(tenant=tenant_a, defaults={"helpful_weight": 0.1})
    first, second = make(tenant_a, DB_SLOW_2, confidence=0.5), make(tenant_a, DB_SLOW, confidence=0.5)
    embed(tenant_a)
    query = "slow postgres orders query"

    def score_of(experience):
        found = experiences_for_context(
            tenant=tenant_a, session=session, query=query, limit=5, max_chars=2000
        )
        return next(m.score for m in found if m.experience_id == experience.public_id)

    before = score_of(first)
    for _ in range(3):
        experience_feedback(tenant=tenant_a, experience=first, helpful=True)
    assert score_of(first) == pytest.approx(before + 0.1 * 3 / 4, abs=1e-4)
    experience_feedback(tenant=tenant_a, experience=second, helpful=False)
    assert score_of(second) < score_of(first)


def test_a_pending_experience_reaches_the_slot_by_full_text(tenant_a, session):
    pending = make(tenant_a, NGINX)
    memories = experiences_for_context(
        tenant=tenant_a, session=session, query="nginx 502 bad gateway", limit=5, max_chars=2000
    )
    assert [m.experience_id for m in memories] == [pending.public_id]


def test_mark_used_counts_uses_and_ignores_foreign_ids(tenant_a, tenant_b):
    mine, theirs = make(tenant_a, NGINX), make(tenant_b, NGINX)
    experiences_mark_used(tenant=tenant_a, experience_ids=[mine.public_id, theirs.public_id])
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.use_count == 1 and mine.last_used_at is not None
    assert theirs.use_count == 0 and theirs.last_used_at is None


def test_search_never_crosses_tenants(tenant_a, tenant_b):
    make(tenant_a, NGINX)
    embed(tenant_a)
    assert experiences_search(tenant=tenant_b, query="nginx 502 bad gateway").hits == []


def test_queries_with_quotes_backslashes_or_no_words_are_safe(tenant_a):
    nginx = make(tenant_a, NGINX)
    hits = experiences_search(
        tenant=tenant_a, query="nginx's 502 \\ 'bad' gateway: & | ! (", sources=["text"]
    ).hits
    assert [h.experience.pk for h in hits] == [nginx.pk]
    assert experiences_search(tenant=tenant_a, query="the and of", sources=["text"]).hits == []
