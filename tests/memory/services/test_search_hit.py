"""One hit type: experiences search, memory search and context recall answer with `SearchHit`."""

from __future__ import annotations

import pytest

from memory.services import experiences, memory_search
from memory.services.experience_search import experiences_search
from memory.services.search_hit import SearchHit

pytestmark = pytest.mark.django_db


def test_both_searches_find_an_experience_as_the_same_hit(tenant_a):
    created = experiences.experience_create(
        tenant=tenant_a,
        problem="nginx answers 502 bad gateway on deploy",
        solution="raise proxy_read_timeout",
    ).experience
    [by_experiences] = experiences_search(tenant=tenant_a, query="nginx 502 gateway", sources=["text"]).hits
    [by_memory] = memory_search.memory_search(
        tenant=tenant_a, query="nginx 502 gateway", kinds=["experience"]
    ).results
    assert type(by_experiences) is type(by_memory) is SearchHit
    assert memory_search.SearchHit is SearchHit
    for hit in (by_experiences, by_memory):
        assert (hit.kind, hit.id, hit.text) == ("experience", created.public_id, created.text)
        assert hit.occurred_at == created.created_at
    # One ranker (ranking.rank) for both: a score is relative to its pool (one candidate here: 0)
    # and its contributions add up to it.
    assert by_experiences.score == by_memory.score == 0
    assert by_memory.score == pytest.approx(sum(by_memory.contributions.values()))
    # The experiences search's hit also carries the row and its full-text rank.
    assert by_experiences.experience == created and 0 < by_experiences.text_score <= 1
    assert by_experiences.contributions == {"text": by_experiences.score}
