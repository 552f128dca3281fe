"""The per-process caches keep their bounds: recent cognitive states (RECENT_STATES_MAX_BYTES of
JSON text); the least recently used goes first."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from memory.services.cognition import state


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
