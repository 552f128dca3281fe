"""A large tenant's word statistics snapshot (memory_search/term_stats.py): exact as of the
snapshot, per tenant, never counting a rolled-back write, used by a whole-tenant search only
within its bounds, and the search finds the same turns with it as without it."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from memory.models import SearchTermSnapshot, SearchTermStat
from memory.services import message_indexing
from memory.services.memory_search import SearchScope, corpus, memory_search, term_stats
from memory.services.sessions import session_create, session_delete
from tests.memory.services.test_context_recall import say

pytestmark = pytest.mark.django_db

TERMS = ["violin", "puppy", "biscuit", "the", "weather"]


@pytest.fixture
def talks(tenant_a: Any, tenant_b: Any) -> dict[str, Any]:
    first = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    say(tenant_a, first, "I adopted a golden retriever puppy named Biscuit.", "Biscuit chews my violin case.")
    second = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u2")
    say(tenant_a, second, "I started learning the violin.", "The weather was rainy all week.")
    foreign = session_create(tenant=tenant_b, agent_external_id="bot", user_id="u1")
    say(tenant_b, foreign, "Violin, violin, violin: Bob's violin lessons.", "A puppy too.")
    message_indexing.memory_index_drain()
    return {"first": first, "second": second, "foreign": foreign}


def counts(tenant: Any, current_rows: int) -> dict[str, int | None] | None:
    snapshot = term_stats.snapshot_counts(
        tenant_id=tenant.pk, terms=TERMS, config="english", current_rows=current_rows
    )
    return None if snapshot is None else snapshot.df


def test_the_snapshot_holds_each_words_messages_in_this_tenant_only(tenant_a, tenant_b, talks):
    assert counts(tenant_a, 4) is None  # no snapshot yet: the search counts as before
    assert term_stats.term_stats_refresh(tenant_a)
    # "the" is a stopword of the english configuration: ignored, like PostgreSQL's full text.
    assert counts(tenant_a, 4) == {"violin": 2, "puppy": 1, "biscuit": 2, "the": None, "weather": 1}
    snapshot = SearchTermSnapshot.objects.get(tenant=tenant_a)
    assert snapshot.messages == 4 and snapshot.avg_len > 0
    assert not SearchTermStat.objects.filter(tenant=tenant_b).exists()
    term_stats.term_stats_refresh(tenant_b)
    assert counts(tenant_b, 2) == {"violin": 1, "puppy": 1, "biscuit": 0, "the": None, "weather": 0}
    # Refreshing again replaces the snapshot: no doubled counts.
    term_stats.term_stats_refresh(tenant_a)
    assert counts(tenant_a, 4) == {"violin": 2, "puppy": 1, "biscuit": 2, "the": None, "weather": 1}


def test_a_rolled_back_write_is_never_counted_and_a_deleted_one_leaves_at_the_next_refresh(tenant_a, talks):
    with pytest.raises(RuntimeError), transaction.atomic():
        say(tenant_a, talks["first"], "Another violin, another puppy.")
        raise RuntimeError("the caller's transaction fails")
    term_stats.term_stats_refresh(tenant_a)
    assert counts(tenant_a, 4) == {"violin": 2, "puppy": 1, "biscuit": 2, "the": None, "weather": 1}
    session_delete(tenant=tenant_a, session=talks["second"])
    term_stats.term_stats_refresh(tenant_a)
    assert counts(tenant_a, 2) == {"violin": 1, "puppy": 1, "biscuit": 2, "the": None, "weather": 0}


def test_a_stale_or_drifted_snapshot_is_not_used(tenant_a, talks):
    term_stats.term_stats_refresh(tenant_a)
    # The tenant has since grown past the bound (10%): its counts could be off by more.
    assert counts(tenant_a, 5) is None
    assert counts(tenant_a, 4) is not None
    SearchTermSnapshot.objects.filter(tenant=tenant_a).update(
        taken_at=timezone.now() - timedelta(seconds=term_stats.SNAPSHOT_MAX_AGE + 60)
    )
    assert counts(tenant_a, 4) is None


def test_a_whole_tenant_search_finds_the_same_turns_with_the_snapshot_and_never_another_tenants(
    tenant_a, talks, monkeypatch
):
    monkeypatch.setattr(corpus, "SCOPE_CORPUS_MAX", 0)  # every scope counts as large
    corpus._large_scopes.clear()

    def ranked(query: str) -> list[tuple[str, float]]:
        return [
            (hit.id, hit.score)
            for hit in memory_search(tenant=tenant_a, query=query, kinds=["message"]).results
        ]

    queries = ["Who plays the violin?", "What is the puppy called?", "How was the weather?"]
    counted = [ranked(q) for q in queries]
    term_stats.term_stats_refresh(tenant_a)
    from memory.services.memory_search import large_stats

    large_stats._large_term_counts.clear()  # the counts cached by the searches above
    assert [ranked(q) for q in queries] == counted
    sessions = {talks["first"].public_id, talks["second"].public_id}
    assert counted[0] and all(hit.split(":")[0] in sessions for hits in counted for hit, _ in hits)
    assert counted[0][0][0].startswith(talks["second"].public_id)  # "I started learning the violin."
    # One user's scope never reads the tenant's snapshot, and never another user's messages.
    user = memory_search(tenant=tenant_a, query="violin", scope=SearchScope(user_id="u1"), kinds=["message"])
    assert {hit.session for hit in user.results} == {talks["first"].public_id}


@pytest.mark.django_db(transaction=True)
def test_the_first_whole_tenant_search_starts_the_snapshot_on_a_thread_of_its_own(tenant_a, monkeypatch):
    monkeypatch.setattr(corpus, "SCOPE_CORPUS_MAX", 0)  # every scope counts as large
    corpus._large_scopes.clear()
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    say(tenant_a, session, "I started learning the violin.", "The weather was rainy all week.")
    # Answered at once by counting; the snapshot comes after, outside the request.
    assert memory_search(tenant=tenant_a, query="violin lessons", kinds=["message"]).results
    deadline = time.monotonic() + 30
    while not SearchTermSnapshot.objects.filter(tenant=tenant_a).exists():
        assert time.monotonic() < deadline, "no snapshot was taken"
        time.sleep(0.05)
    assert counts(tenant_a, 2) == {"violin": 1, "puppy": 0, "biscuit": 0, "the": None, "weather": 1}
