"""The per-process caches keep their bounds: memory search's scope corpora (at most
SCOPE_CORPUS_CACHE scopes and SCOPE_CORPUS_ROWS messages in all) and recent cognitive states
(RECENT_STATES_MAX_BYTES of JSON text); the least recently used goes first."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest

from memory.services.cognition import state
from memory.services.memory_search import corpus
from memory.services.memory_search.corpus import (
    SCOPE_CORPUS_CACHE,
    SCOPE_CORPUS_ROWS,
    ScopeCorpora,
    ScopeCorpus,
)


def scope_of(rows: int) -> tuple[tuple[int, ...], ScopeCorpus]:
    ids = list(range(rows))
    return (rows, rows, 0, "", ""), ScopeCorpus(
        ids=ids, rows={}, texts=[], tokens=[], df=Counter(), avg_len=0.0, by_position={}
    )


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
