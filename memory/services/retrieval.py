"""Hybrid retrieval of experiences (pgvector + full text).

CONTRACT (called by the context engine; keep these signatures):
- experiences_for_context: the memory slot of a built context.
- experiences_mark_used: after a build included them (use count, last used).
Placeholder bodies until the experience-memory capability lands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RetrievedMemory:
    experience_id: str  # public id
    text: str  # what goes into the prompt
    score: float  # 0.5·similarity + 0.3·confidence + 0.2·scope priority (plus feedback)
    similarity: float
    confidence: float
    scope_priority: float


def experiences_for_context(
    *, tenant: Any, session: Any, query: str, limit: int, max_chars: int
) -> list[RetrievedMemory]:
    """The best experiences for `query`, at most `limit`, their texts within `max_chars` in total."""
    return []


def experiences_mark_used(*, tenant: Any, experience_ids: list[str]) -> None:
    """Count a use of each experience (use count + 1, last used = now)."""
    return None
