"""Context recall: what the window forgot, found again for the next input.

`context_recall` searches (memory_search) the session's own older messages, the same user's
earlier sessions with the same agent (or the agent's, when the session has no user), their
summaries and tracked facts, and the tenant's (and user's) experiences; it leaves out what the
prompt already carries (window messages, the current summary, pinned facts, retrieved
memories), keeps hits scoring at least `min_score` (relative to the pool) or with a cosine of at least
`min_similarity` (absolute), at most `top_k` of them, within
`budget_share` of the token budget. The context builder places them at the start or the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from memory.exceptions import InvalidInput
from memory.models import Session, Tenant
from memory.services import memory_search, sharing
from memory.services.message_indexing import memory_policy_get

POSITIONS = ("start", "end")
# name → (type, minimum, maximum) of the request's `recall` object
RECALL_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "enabled": (bool, None, None),
    "top_k": (int, 0, 50),
    "min_score": (float, -10.0, 10.0),
    "min_similarity": (float, -1.0, 1.0),
    "position": (str, None, None),
    "budget_share": (float, 0.0, 1.0),
    "query": (str, None, None),
}


@dataclass(frozen=True)
class RecallPolicy:
    enabled: bool
    top_k: int
    min_score: float
    min_similarity: float
    position: str
    budget_share: float
    query: str = ""  # an explicit search query (default: the next input)


@dataclass
class RecalledItem:
    kind: str  # message | summary | fact | experience
    id: str
    text: str  # what goes into the prompt
    score: float
    reason: str
    session: str | None
    seq: int | None
    occurred_at: str | None
    contributions: dict[str, float]
    agent: str = ""  # the agent whose session or record it came from (sharing.py)


def recall_policy_effective(*, tenant: Tenant, overrides: Any = None) -> RecallPolicy:
    """The tenant's MemoryPolicy recall fields ← this request's `recall` object. Raises InvalidInput."""
    base = memory_policy_get(tenant=tenant)
    policy = RecallPolicy(
        enabled=base.recall_enabled,
        top_k=base.recall_top_k,
        min_score=base.recall_min_score,
        min_similarity=base.recall_min_similarity,
        position=base.recall_position,
        budget_share=base.recall_budget_share,
    )
    if overrides is None:
        return policy
    if not isinstance(overrides, dict):
        raise InvalidInput(details={"fields": {"recall": ["Expected an object."]}})
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in RECALL_FIELDS:
            raise InvalidInput(
                f"Unknown recall key {key!r}; known: {', '.join(sorted(RECALL_FIELDS))}.",
                details={"fields": {f"recall.{key}": ["Unknown key."]}},
            )
        kind, low, high = RECALL_FIELDS[key]
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is str:
            ok = isinstance(value, str)
        else:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and (kind is float or float(value).is_integer())
        if not ok:
            raise InvalidInput(details={"fields": {f"recall.{key}": [f"Expected {kind.__name__}."]}})
        if kind in (int, float):
            value = kind(value)
            if (low is not None and value < low) or (high is not None and value > high):
                raise InvalidInput(
                    details={"fields": {f"recall.{key}": [f"Must be between {low} and {high}."]}}
                )
        if key == "position" and value not in POSITIONS:
            raise InvalidInput(details={"fields": {"recall.position": ["Must be 'start' or 'end'."]}})
        values[key] = value
    return replace(policy, **values)


def _prompt_text(hit: memory_search.SearchHit) -> str:
    if hit.kind == "message":
        when = hit.occurred_at.strftime("%-d %B %Y") if hit.occurred_at else "earlier"
        who = f"{hit.speaker}: " if hit.speaker else ""
        return f"Recalled from an earlier conversation ({when}) — {who}{hit.text}"
    if hit.kind == "summary":
        return f"Recalled summary of an earlier session: {hit.text}"
    if hit.kind == "fact":
        return f"Recalled fact — {hit.text}"
    return f"Recalled past experience: {hit.text}"


def _why(hit: memory_search.SearchHit, current_session: str) -> str:
    where = {
        "message": "an older message of this session"
        if hit.session == current_session
        else "an earlier session",
        "summary": "a summary of an earlier session",
        "fact": "a tracked fact",
        "experience": "an experience",
    }[hit.kind]
    signals = ", ".join(f"{name} {value:+.2f}" for name, value in hit.contributions.items() if value)
    return f"recalled: {where} relevant to the query ({signals or 'score'})"


@dataclass(frozen=True)
class RecallRequest:
    """What a build asks recall for. `window_seqs`: seqs of this session already in the prompt;
    `exclude_ids`: ids of summaries, facts and experiences already in it."""

    session: Session
    policy: RecallPolicy
    query: str
    window_seqs: set[int]
    exclude_ids: set[str]
    budget_tokens: int


def context_recall(
    *, tenant: Tenant, request: RecallRequest, count_tokens: Callable[[str], int]
) -> list[RecalledItem]:
    """The items to recall into the next prompt, best first. Read-only.

    Returns [] when recall is off, the query is empty, or nothing clears `min_score`. Never
    raises for an unavailable embedder (words still answer).
    """
    session, policy, exclude_ids = request.session, request.policy, request.exclude_ids
    query = (policy.query or request.query or "").strip()
    if not policy.enabled or policy.top_k <= 0 or not query or policy.budget_share <= 0:
        return []
    result = memory_search.memory_search(
        tenant=tenant,
        query=query[:4000],
        scope=memory_search.SearchScope(
            agent=sharing.recall_agent_scope(tenant=tenant, session=session),
            session=session.public_id,
            sessions="all",
            reader_agent=session.agent.external_id,
        ),
        limit=min(memory_search.MAX_LIMIT, policy.top_k + len(exclude_ids) + 10),
        exclude_messages={(session.public_id, seq) for seq in request.window_seqs},
    )
    allowance = int(request.budget_tokens * policy.budget_share)
    used = 0
    items: list[RecalledItem] = []
    origins = sharing.recall_provenance(tenant=tenant, session=session, hits=result.results)
    for hit in result.results:
        if len(items) >= policy.top_k:
            break
        origin = origins.get((hit.kind, hit.id))
        if origin is None:  # another agent's, of a kind the tenant does not share
            continue
        # Relevance, without the length prior (ranking.py): a long but unrelated turn must not
        # clear the threshold on its length alone.
        relevance = hit.relevance - hit.contributions.get("length", 0.0)
        relevant = relevance >= policy.min_score or (
            hit.similarity is not None and hit.similarity >= policy.min_similarity
        )
        if not relevant:
            continue
        if hit.kind != "message" and hit.id in exclude_ids:
            continue
        text = _prompt_text(hit)
        cost = count_tokens(text) + 4
        if used + cost > allowance:
            continue
        used += cost
        items.append(
            RecalledItem(
                kind=hit.kind,
                id=hit.id,
                text=text,
                score=hit.relevance,
                reason=_why(hit, session.public_id),
                session=origin.session,
                seq=hit.seq,
                occurred_at=hit.occurred_at.isoformat() if hit.occurred_at else None,
                contributions=hit.contributions,
                agent=origin.agent,
            )
        )
    return items
