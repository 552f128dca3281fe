"""The `user_profile` component of a context build: what is known about the session's user.

The session user's current memories (UserMemory rows with no `valid_to`: a superseded value never
enters a prompt) within `user_profile_share` of the token budget, capped at
`user_profile_max_tokens`. When they do not all fit, the best go first: relevance to the current
turn (shared words, or the meaning of the memory's stored embedding near the query's), then type
priority (constraints and preferences before plain facts: an agent that breaks a constraint fails
the user outright), then confidence. Memories taken from another agent's sessions enter only when
the tenant's sharing policy shares user memories (sharing.user_memory_reader_filter); those are
not candidates at all, so the manifest does not name them either.

The block is one user-role message (carried_over_message): a memory's text was written by the
user, an extractor or an API key, and must not gain the authority of the system prompt. It is
placed right after the system parts, before history. Read-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgvector.django import CosineDistance

from memory.models import Session, Tenant, UserMemoryType
from memory.services import embedding, sharing, tokens
from memory.services.context_items import ContextItem, carried_over_message
from memory.services.context_policy import EffectivePolicy
from memory.services.ranking import tokenize
from memory.services.user_memory.store import memories_of

HEADER = "What is known about this user (current values; each replaced an older one if it changed):"
# Constraints and preferences first: breaking one is what a user notices at once.
TYPE_PRIORITY: dict[str, float] = {
    UserMemoryType.CONSTRAINT.value: 1.0,
    UserMemoryType.PREFERENCE.value: 0.9,
    UserMemoryType.PROFILE.value: 0.7,
    UserMemoryType.DECISION.value: 0.6,
    UserMemoryType.PLAN.value: 0.5,
    UserMemoryType.FACT.value: 0.4,
}
WEIGHTS = {"relevance": 0.5, "type": 0.3, "confidence": 0.2}
MAX_CANDIDATES = 500  # a user with more current memories gets the newest 500 considered
# Memories left out that the manifest names (the best of them); the rest are only counted, so a
# build's stored manifest stays small for a user with hundreds of memories.
LISTED_LEFT_OUT = 20
COLUMNS = ("public_id", "subject", "memory_type", "text", "confidence", "agent", "valid_from")


@dataclass(frozen=True)
class ProfileMemory:
    """What the block needs of a current UserMemory row (read as values: no model instances)."""

    public_id: str
    subject: str
    memory_type: str
    text: str
    confidence: float
    agent: str
    valid_from: Any
    distance: float | None = None  # cosine distance of its embedding to the query's (None: none)


@dataclass
class ProfileEntry:
    """One current memory considered for the block, with what it scored and why it is (not) in."""

    memory: ProfileMemory
    relevance: float
    score: float
    line: str
    included: bool = False
    reason: str = ""

    def manifest(self, tokens_of_line: int) -> dict[str, Any]:
        return {
            "id": self.memory.public_id,
            "subject": self.memory.subject,
            "type": self.memory.memory_type,
            "score": self.score,
            "relevance": self.relevance,
            "confidence": round(self.memory.confidence, 4),
            "agent": self.memory.agent,
            "tokens": tokens_of_line,
            "included": self.included,
            "reason": self.reason,
        }


def _relevance(query_terms: set[str], memory: ProfileMemory) -> float:
    """0..1: the share of the query's words the memory (text or subject) holds, or the cosine of
    its embedding to the query's (`distance`, computed by PostgreSQL), whichever is higher."""
    lexical = 0.0
    if query_terms:
        own = set(tokenize(f"{memory.text} {memory.subject.replace('.', ' ').replace('_', ' ')}"))
        lexical = len(own & query_terms) / len(query_terms)
    dense = max(0.0, 1.0 - float(memory.distance)) if memory.distance is not None else 0.0
    return max(lexical, dense)


def _line(memory: ProfileMemory, reader_agent: str) -> str:
    where = f" [from agent {memory.agent}]" if memory.agent != reader_agent else ""
    return f"- {memory.text} ({memory.memory_type}: {memory.subject}){where}"


def profile_allowance(policy: EffectivePolicy, budget_tokens: int) -> int:
    """Tokens the block may use: the policy's share of the budget, at most its cap."""
    return min(int(budget_tokens * policy.user_profile_share), policy.user_profile_max_tokens)


def _block(lines: list[str], reader_agent: str) -> dict[str, Any]:
    return carried_over_message("\n".join([HEADER, *lines]), source="user_profile", agent=reader_agent)


def user_profile_item(
    *,
    tenant: Tenant,
    session: Session,
    policy: EffectivePolicy,
    counter: tokens.TokenCounter,
    budget_tokens: int,
    query: str,
    query_vector: embedding.QueryEmbedding | None = None,
) -> ContextItem | None:
    """The `user_profile` candidate: one block of the user's best current memories within the
    allowance, its manifest entry listing every memory considered (chosen or left out, and why).
    None for a session without a user, a zero allowance, or a user with no readable memory.
    `query_vector`: the build's embedding of `query` (embedded here when not given)."""
    allowance = profile_allowance(policy, budget_tokens)
    if not session.user_id or allowance <= 0:
        return None
    reader = session.agent.external_id
    readable = memories_of(tenant=tenant, user_id=session.user_id).filter(
        sharing.user_memory_reader_filter(tenant=tenant, agent=reader)
    )
    # The build's one embedding of its query (recall and experiences rank by the same vector).
    vector = (query_vector or embedding.QueryEmbedding(query)).get()
    columns: list[str] = list(COLUMNS)
    if vector is not None:
        # The cosine in the database: no vector is shipped to and parsed in this process.
        readable = readable.annotate(distance=CosineDistance("embedding", vector))
        columns.append("distance")
    memories = [
        ProfileMemory(**row) for row in readable.order_by("-valid_from").values(*columns)[:MAX_CANDIDATES]
    ]
    if not memories:
        return None
    query_terms = set(tokenize(query))
    entries = []
    for memory in memories:
        relevance = _relevance(query_terms, memory)
        score = (
            WEIGHTS["relevance"] * relevance
            + WEIGHTS["type"] * TYPE_PRIORITY.get(memory.memory_type, 0.4)
            + WEIGHTS["confidence"] * memory.confidence
        )
        entries.append(ProfileEntry(memory, round(relevance, 4), round(score, 4), _line(memory, reader)))
    entries.sort(key=lambda e: (-e.score, e.memory.subject))
    return _packed(entries, allowance=allowance, counter=counter, reader=reader)


def _packed(
    entries: list[ProfileEntry], *, allowance: int, counter: tokens.TokenCounter, reader: str
) -> ContextItem | None:
    """Take entries best first while the block's exact token count stays within the allowance (a
    long one that does not fit is skipped; a shorter one after it may still fit)."""
    line_tokens = [counter.count(e.line) + 1 for e in entries]  # + the newline before it
    used = counter.message_tokens(_block([], reader))
    taken: list[ProfileEntry] = []
    for entry, cost in zip(entries, line_tokens, strict=True):
        if used + cost <= allowance:
            taken.append(entry)
            used += cost
    # Counted line by line above; the block as one text is counted once more, exactly, and the
    # weakest taken memories give way should it come out longer.
    while taken and counter.message_tokens(_block([e.line for e in taken], reader)) > allowance:
        taken.pop()
    chosen = [e.line for e in taken]
    taken_ids = {id(e) for e in taken}
    for entry, cost in zip(entries, line_tokens, strict=True):
        entry.included = id(entry) in taken_ids
        entry.reason = (
            f"included: {entry.memory.memory_type} (priority "
            f"{TYPE_PRIORITY.get(entry.memory.memory_type, 0.4):.1f}), relevance "
            f"{entry.relevance:.2f} to the input, confidence {entry.memory.confidence:.2f}"
            if entry.included
            else f"over the user_profile share of {allowance} tokens ({cost} more would not fit; "
            "ranked below those included by relevance, type and confidence)"
        )
    if not chosen:
        # Not even the best memory fits: the manifest still says what was left out and why.
        item = ContextItem("user_profile", "user_profile", "user_profile", [], included=False)
        item.reason = f"no memory fits the user_profile share ({allowance} tokens)"
    else:
        item = ContextItem("user_profile", "user_profile", "user_profile", [_block(chosen, reader)])
        item.reason = f"included: {len(chosen)} of {len(entries)} current memories of the user"
    item.score = max(e.score for e in entries)
    listed = []
    dropped = 0
    for entry, cost in zip(entries, line_tokens, strict=True):
        if not entry.included:
            dropped += 1
            if dropped > LISTED_LEFT_OUT:
                continue
        listed.append(entry.manifest(cost))
    item.extra = {
        "allowance_tokens": allowance,
        "memories": listed,
        "memories_not_listed": max(0, dropped - LISTED_LEFT_OUT),
    }
    return item


def profile_memory_ids(item: ContextItem | None) -> set[str]:
    """The public ids of the memories the block carries (recall leaves them out)."""
    if item is None or not item.included:
        return set()
    return {m["id"] for m in item.extra.get("memories", []) if m["included"]}
