"""The one hit type of every search: experiences search (`/experiences/search`), memory search
(`/memory/search`) and the context recall built on it all answer with `SearchHit`.

A leaf module (models only), so that both engines import it without importing each other. The
API renders a hit with its capability's serializer (memory/api/experience_serializers.py for an
experiences search, memory/api/memory.py for a memory search).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory.models import Experience, Message


@dataclass
class SearchHit:
    kind: str  # message | summary | fact | experience | user_memory
    id: str  # a message: `<session id>:<seq>`; the others: their public id
    text: str
    score: float  # its place in the list it was answered in
    contributions: dict[str, float]  # each signal's share of the score
    similarity: float | None = None  # cosine to the query (None: no vector)
    occurred_at: datetime | None = None
    # The ranking's score (its contributions add up to it). A memory search ranks every kind
    # in one pool, so it equals `score`; thresholds compare this one.
    relevance: float = 0.0
    # messages
    session: str | None = None
    seq: int | None = None
    speaker: str = ""
    neighbours: list[Message] | None = None  # the turns around it (when asked)
    # user memories: the turns ({session, seq}) the memory was taken from
    sources: list[dict[str, Any]] | None = None
    # experiences search: the row, and its normalised full-text rank among the candidates
    experience: Experience | None = None
    text_score: float = 0.0
