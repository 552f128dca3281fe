"""Memory search's results: hits from ranked candidates, with the turns around each message."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Q

from memory.models import Message, Tenant
from memory.services import ranking
from memory.services.memory_search.sql import MessageCandidate
from memory.services.memory_search.user_memories import UserMemoryCandidate
from memory.services.search_hit import SearchHit

__all__ = ["SearchHit", "SearchResult", "hit_from_ranked", "message_id", "neighbours_attach"]


@dataclass
class SearchResult:
    query: str
    results: list[SearchHit]
    plan: ranking.Plan
    warnings: list[str] = field(default_factory=list)
    candidates: int = 0


def message_id(session_public_id: str, seq: int) -> str:
    """A message's id in search results: `<session id>:<seq>`."""
    return f"{session_public_id}:{seq}"


def hit_from_ranked(item: ranking.Ranked, *, score: float) -> SearchHit:
    c = item.candidate
    kind, _, ident = c.key.partition(":")
    if isinstance(c, MessageCandidate):
        assert c.group is not None and c.position is not None
        return SearchHit(
            kind="message", id=message_id(c.group, c.position), session=c.group, seq=c.position,
            occurred_at=c.occurred_at, text=c.content, speaker=c.speaker, score=score,
            contributions=item.contributions, similarity=c.dense, relevance=item.score,
        )  # fmt: skip
    return SearchHit(
        kind=kind, id=ident, session=None, seq=None, occurred_at=c.occurred_at, text=c.text,
        score=score, contributions=item.contributions, similarity=c.dense, relevance=item.score,
        sources=list(c.sources) if isinstance(c, UserMemoryCandidate) else None,
    )  # fmt: skip


def neighbours_attach(*, tenant: Tenant, hits: list[SearchHit], radius: int) -> None:
    wanted = [(h.session, h.seq) for h in hits if h.kind == "message" and h.session and h.seq is not None]
    if not wanted:
        for h in hits:
            h.neighbours = []
        return
    condition = Q()
    for session_public_id, seq in wanted:
        assert seq is not None
        condition |= Q(session__public_id=session_public_id, seq__gte=seq - radius, seq__lte=seq + radius)
    rows = (
        Message.objects.filter(tenant=tenant)
        .filter(condition)
        .select_related("session")
        .only("seq", "role", "name", "content", "occurred_at", "session__public_id")
        .order_by("session_id", "seq")
    )
    by_session: dict[str, list[Message]] = {}
    for row in rows:
        by_session.setdefault(row.session.public_id, []).append(row)
    for h in hits:
        if h.kind != "message" or h.seq is None or h.session is None:
            h.neighbours = []
            continue
        seq = h.seq
        h.neighbours = [
            m for m in by_session.get(h.session, []) if m.seq != seq and abs(m.seq - seq) <= radius
        ]
