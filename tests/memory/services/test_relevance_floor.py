"""The relevance floor (memory/services/relevance_floor.py): words or meaning, or not listed."""

from __future__ import annotations

from datetime import UTC, datetime

from memory.services.ranking import Candidate, index_text
from memory.services.relevance_floor import NO_FLOOR, passes_floor

WHEN = datetime(2024, 6, 1, tzinfo=UTC)


def message(content: str, dense: float | None, speaker: str = "Lina") -> Candidate:
    text = index_text(content=content, speaker=speaker, occurred_at=WHEN)
    return Candidate(
        key="message:1", kind="message", text=text, group="s", position=1, occurred_at=WHEN, dense=dense
    )


def test_a_shared_word_or_a_near_meaning_passes():
    assert passes_floor(
        query="Where is the wedding?", candidate=message("The wedding is in Como.", 0.0), min_similarity=0.15
    )
    assert passes_floor(
        query="Where do they marry?", candidate=message("Vineyard near Como.", 0.4), min_similarity=0.15
    )
    # Without a vector (not embedded yet) words alone decide.
    assert passes_floor(
        query="wedding plans", candidate=message("The wedding is in June.", None), min_similarity=0.15
    )


def test_neither_words_nor_meaning_is_left_out_and_the_speaker_or_date_prefix_is_no_word():
    unrelated = message("Promote the replica with pg_ctl.", 0.05)
    assert not passes_floor(query="Where is the wedding?", candidate=unrelated, min_similarity=0.15)
    # "Lina" and "June" are in the prefix every turn of the session carries: they do not count.
    assert not passes_floor(query="What did Lina say in June 2024?", candidate=unrelated, min_similarity=0.15)
    assert not passes_floor(
        query="wedding", candidate=message("Promote the replica.", None), min_similarity=0.15
    )


def test_the_lowest_cosine_is_no_floor():
    assert passes_floor(
        query="wedding", candidate=message("Promote the replica.", None), min_similarity=NO_FLOOR
    )
