"""A scope too large to cache (memory_search/candidates.py): the lexical pool is read first, the
dense pool and every candidate's cosine in a second statement; a turn either pool found has the
same cosine as in the cached path, and nothing of another tenant comes back."""

from __future__ import annotations

from typing import Any

import pytest

from memory.services.embedding import EmbedderUnavailable
from memory.services.memory_search import corpus, memory_search, search
from tests.memory.services.test_memory_search_term_stats import talks  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

QUERIES = ["Who plays the violin?", "What is the puppy called?", "How was the weather?"]


def similarities(tenant: Any, query: str) -> dict[str, float | None]:
    # No relevance floor: every turn of the pool, related or not, shows its cosine.
    result = memory_search(tenant=tenant, query=query, kinds=["message"], limit=50, min_similarity=-1)
    return {hit.id: hit.similarity for hit in result.results}


def test_every_turn_of_a_large_scope_has_its_cosine_whichever_pool_found_it(tenant_a, talks, monkeypatch):  # noqa: F811
    cached = {query: similarities(tenant_a, query) for query in QUERIES}
    monkeypatch.setattr(corpus, "SCOPE_CORPUS_MAX", 0)  # every scope counts as large
    corpus._large_scopes.clear()
    for query in QUERIES:
        large = similarities(tenant_a, query)
        # Four turns: each is in the dense pool, the ones with a query word in the lexical pool too.
        assert set(large) == set(cached[query]) and len(large) == 4
        assert all(value is not None for value in large.values())
        assert large == pytest.approx(cached[query], abs=1e-6)
    sessions = {talks["first"].public_id, talks["second"].public_id}
    assert all(hit_id.split(":")[0] in sessions for hit_id in similarities(tenant_a, "violin"))


def test_without_the_embedder_a_large_scope_answers_by_words_with_a_warning(tenant_a, talks, monkeypatch):  # noqa: F811
    def unavailable(text: str) -> Any:
        raise EmbedderUnavailable("connection refused")

    monkeypatch.setattr(search, "embed_query", unavailable)
    monkeypatch.setattr(corpus, "SCOPE_CORPUS_MAX", 0)
    corpus._large_scopes.clear()
    result = memory_search(tenant=tenant_a, query="Who plays the violin?", kinds=["message"], limit=50)
    assert result.warnings and "ranked by words only" in result.warnings[0]
    assert result.results and all(hit.similarity is None for hit in result.results)
    assert "violin" in result.results[0].text.lower()  # the others: its neighbours, or the other violin turn


def test_an_unexpected_embedding_error_is_raised_to_the_caller(tenant_a, talks, monkeypatch):  # noqa: F811
    def broken(text: str) -> Any:
        raise RuntimeError("model file corrupt")

    monkeypatch.setattr(search, "embed_query", broken)
    with pytest.raises(RuntimeError, match="model file corrupt"):
        memory_search(tenant=tenant_a, query="Who plays the violin?", kinds=["message"])
