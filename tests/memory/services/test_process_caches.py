"""The per-process caches keep their bounds: memory search's scope corpora (at most
SCOPE_CORPUS_CACHE scopes, SCOPE_CORPUS_ROWS messages and CTXAPP_MEMORY_SEARCH_CACHE_MB in all)
and recent cognitive states (RECENT_STATES_MAX_BYTES of JSON text); the least recently used goes first."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from memory.services.cognition import state
from memory.services.embedding import EMBEDDING_DIMENSIONS
from memory.services.memory_search import corpus
from memory.services.memory_search.corpus import (
    SCOPE_CORPUS_CACHE,
    SCOPE_CORPUS_ROWS,
    ScopeCorpora,
    ScopeCorpus,
    corpus_build,
)


def scope_of(rows: int) -> tuple[tuple[int, ...], ScopeCorpus]:
    ids = list(range(rows))
    return (rows, rows, 0, "", ""), ScopeCorpus(ids=ids, rows={}, texts=[], avg_len=0.0, by_position={})


def test_at_most_so_many_scopes_are_kept_least_recently_used_out() -> None:
    cache = ScopeCorpora()
    for key in range(SCOPE_CORPUS_CACHE):
        cache[(key,)] = scope_of(1)
    assert cache.get((0,)) is not None  # read: now the most recent
    cache[("new",)] = scope_of(1)
    assert len(cache) == SCOPE_CORPUS_CACHE
    assert (1,) not in cache and (0,) in cache and ("new",) in cache


def test_at_most_so_many_messages_are_kept_over_all_scopes() -> None:
    cache = ScopeCorpora()
    per_scope = SCOPE_CORPUS_ROWS // 4
    for key in range(4):
        cache[(key,)] = scope_of(per_scope)
    assert len(cache) == 4
    cache.get((0,))
    cache[("new",)] = scope_of(per_scope)
    assert sorted(map(str, cache)) == sorted(map(str, [(0,), (2,), (3,), ("new",)]))
    cache[(2,)] = scope_of(per_scope // 2)  # a newer version of a scope replaces the old one
    assert cache[(2,)][1].ids == list(range(per_scope // 2)) and len(cache) == 4


def test_the_scope_cache_is_a_scope_corpora() -> None:
    assert isinstance(corpus._corpora, ScopeCorpora)


@pytest.fixture
def empty_state_cache() -> Iterator[None]:
    state._recent_states.clear()
    yield
    state._recent_states.clear()


def text_of(label: str, size: int) -> str:
    head = json.dumps({"label": label, "pad": ""})
    return json.dumps({"label": label, "pad": "x" * (size - len(head))})


def test_recent_states_are_bounded_by_their_text(empty_state_cache: None) -> None:
    quarter = state.RECENT_STATES_MAX_BYTES // 4
    for label in "abcd":
        state.state_cache_put(label, text_of(label, quarter))
    assert state.state_cache_get("a") == json.loads(text_of("a", quarter))  # now the most recent
    state.state_cache_put("e", text_of("e", quarter))
    assert [label for label in "abcde" if state.state_cache_get(label) is not None] == ["a", "c", "d", "e"]


def test_a_state_over_a_quarter_of_the_cache_is_not_kept(empty_state_cache: None) -> None:
    state.state_cache_put("big", text_of("big", state.RECENT_STATES_MAX_BYTES // 4 + 1))
    state.state_cache_put("small", text_of("small", 100))
    assert state.state_cache_get("big") is None
    first = state.state_cache_get("small")
    assert first is not None and first["label"] == "small"
    first["label"] = "changed"  # a fresh copy each time
    assert state.state_cache_get("small") == json.loads(text_of("small", 100))


def corpus_of(rows: int, *, seed: int) -> ScopeCorpus:
    """A corpus shaped as _corpus_load builds it: vectors, texts, token sets and their indexes."""
    rng = np.random.default_rng(seed)
    texts = [f"[2024-01-01] user: message {seed}-{i} on topic {i % 97} and more" for i in range(rows)]
    occurred = datetime(2024, 1, 1, tzinfo=UTC)
    built = corpus_build(
        ids=list(range(rows)),
        rows={i: (f"ses_{seed}", i, "user", texts[i][20:], occurred) for i in range(rows)},
        texts=texts,
        by_position={(f"ses_{seed}", i): i for i in range(rows)},
        vectors=rng.standard_normal((rows, EMBEDDING_DIMENSIONS)).astype(np.float32),
        embedded=np.ones(rows, dtype=bool),
    )
    return built


def test_a_corpus_size_counts_what_building_it_allocated() -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = corpus_of(2_000, seed=1)
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Not an underestimate (the bound would then be exceeded), and not wildly over.
    assert 0.8 * allocated <= built.nbytes <= 2.5 * allocated
    assert built.nbytes > built.vectors.nbytes + 2_000 * 100


def test_the_scope_cache_stays_under_its_byte_bound(settings: Any) -> None:
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, memory_search_cache_mb=8)
    bound = 8 * 1024 * 1024
    cache = ScopeCorpora()
    one = corpus_of(1_000, seed=0)
    per_cache = bound // one.nbytes
    assert 2 <= per_cache < SCOPE_CORPUS_CACHE  # the byte bound, not the scope count, is what binds
    for key in range(per_cache + 3):
        cache[(key,)] = ((key,), corpus_of(1_000, seed=key))
        assert cache.nbytes() <= bound
    assert len(cache) == per_cache
    assert (per_cache + 2,) in cache and (0,) not in cache  # the least recently used went first
    cache[("huge",)] = ((0,), corpus_of(int(1.2 * bound / one.nbytes * 1_000), seed=99))
    assert ("huge",) not in cache and len(cache) == per_cache  # larger than the bound: not kept
