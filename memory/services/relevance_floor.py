"""The relevance floor of memory search: an item whose words and meaning share nothing with the
query is never listed, whatever its place in the pool's relative scores. Pure (no ORM, no I/O),
like ranking.py, so that bench/bench_ordering.py runs the same function offline."""

from __future__ import annotations

from functools import lru_cache

from memory.services.ranking import INDEX_PREFIX, Candidate, tokenize

NO_FLOOR = -1.0  # the lowest cosine: every item passes, rows without a vector too


@lru_cache(maxsize=65536)
def _own_terms(kind: str, text: str) -> frozenset[str]:
    """The row's own words (a message's without its date and speaker prefix, which every turn of
    a session shares)."""
    if kind == "message":
        prefix = INDEX_PREFIX.match(text)
        if prefix is not None and prefix.end():
            text = text[prefix.end() :]
    return frozenset(tokenize(text))


def passes_floor(*, query: str, candidate: Candidate, min_similarity: float) -> bool:
    """The relevance floor: whether the row shares a word (a `tokenize` term of its own text)
    with the query or its meaning comes near it (cosine ≥ `min_similarity`). A row failing both
    has nothing to do with the query, whatever its place in a pool's relative scores. A floor of
    -1 (the lowest cosine) is no floor: rows without a vector are listed too."""
    if min_similarity <= NO_FLOOR:
        return True
    if candidate.dense is not None and candidate.dense >= min_similarity:
        return True
    return not _own_terms(candidate.kind, candidate.text).isdisjoint(tokenize(query))
