"""Context recall: what the window forgot, found again for the next input.

`context_recall` searches (memory_search) the session's own older messages, the same user's
earlier sessions with the same agent (or the agent's, when the session has no user), their
summaries and tracked facts, the user's memories, and the tenant's (and user's) experiences; it
leaves out what the prompt already carries (window messages, the current summary, pinned facts,
retrieved memories). How much it brings is decided by the scores and the budget, not a fixed
count: hits scoring at least `min_score` (relative to the pool) or with a cosine of at least
`min_similarity` (absolute), and within `relative_gap` of the best hit, best first, as long as
they fit `budget_share` of the token budget and `max_tokens` (at most `top_k` turns and records).
A recalled user memory brings the turns it was taken from (its `sources`): the evidence it stands
for. The turns recalled from one session go into the prompt as one excerpt (one item, `seqs`
lists its turns, in conversation order), so that each further turn of a session costs its words,
not another carried-over block. The context builder places them at the start or the end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db.models import Q

from memory.exceptions import InvalidInput
from memory.models import Message, Session, Tenant, UserMemory
from memory.services import memory_search, sharing
from memory.services.embedding import QueryEmbedding
from memory.services.message_indexing import memory_policy_get

POSITIONS = ("start", "end")
SEARCH_LIMIT = 40  # hits a build's recall search asks for (the budget and the scores then cut)
# A hit whose relevance (without the length prior) is this far under the best hit's is left out:
# the scores' own drop decides how much to bring (docs/memory.md, "Recall across sessions"). In
# z-score units of the pool (ranking.py's fusion); with `top_k` 20 and `max_tokens` 1,000
# (MemoryPolicy), the cut every fold of nested leave-one-conversation-out chose on the LoCoMo-style
# and user-assistant dev sets (the haystack one ties; docs/memory.md, "Through the API").
RELATIVE_GAP_DEFAULT = 6.0
SOURCE_TURNS_MAX = 3  # turns a recalled user memory brings at most
# name → (type, minimum, maximum) of the request's `recall` object
RECALL_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "enabled": (bool, None, None),
    "top_k": (int, 0, 50),
    "min_score": (float, -10.0, 10.0),
    "min_similarity": (float, -1.0, 1.0),
    "position": (str, None, None),
    "budget_share": (float, 0.0, 1.0),
    "max_tokens": (int, 0, 1_000_000),
    "query": (str, None, None),
    "relative_gap": (float, 0.0, 10.0),
}


@dataclass(frozen=True)
class RecallPolicy:
    enabled: bool
    top_k: int
    min_score: float
    min_similarity: float
    position: str
    budget_share: float
    # A ceiling whatever the model's window: a share of a 128k-token budget is far more than
    # recall ever needs, and recalled text the model must read costs on every turn.
    max_tokens: int = 1000
    query: str = ""  # an explicit search query (default: the next input)
    relative_gap: float = RELATIVE_GAP_DEFAULT  # how far under the best hit a recalled one may score


@dataclass
class RecalledItem:
    kind: str  # message | summary | fact | experience | user_memory
    id: str
    text: str  # what goes into the prompt
    score: float
    reason: str
    session: str | None
    seq: int | None
    occurred_at: str | None
    contributions: dict[str, float]
    agent: str = ""  # the agent whose session or record it came from (sharing.py)
    seqs: list[int] = field(default_factory=list)  # a message excerpt: every turn it quotes


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
        max_tokens=base.recall_max_tokens,
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
    if hit.kind == "user_memory":
        return f"Recalled memory about the user: {hit.text}"
    return f"Recalled past experience: {hit.text}"


def _turn_text(message: Message) -> str:
    when = message.occurred_at.strftime("%-d %B %Y") if message.occurred_at else "earlier"
    who = f"{message.name}: " if message.name else ""
    return f"Recalled from an earlier conversation ({when}) — {who}{message.content}"


def _why(hit: memory_search.SearchHit, current_session: str) -> str:
    where = {
        "message": "an older message of this session"
        if hit.session == current_session
        else "an earlier session",
        "summary": "a summary of an earlier session",
        "fact": "a tracked fact",
        "experience": "an experience",
        "user_memory": "a memory about the user",
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
    query_vector: QueryEmbedding | None = None  # the build's embedding of `query`


def context_recall(
    *, tenant: Tenant, request: RecallRequest, count_tokens: Callable[[RecalledItem, str], int]
) -> list[RecalledItem]:
    """The items to recall into the next prompt, best first (a user memory's source turns right
    after it). Read-only.

    Returns [] when recall is off, the query is empty, or nothing clears `min_score`. Never
    raises for an unavailable embedder (words still answer).
    """
    session, policy = request.session, request.policy
    query = (policy.query or request.query or "").strip()
    if (
        not policy.enabled
        or policy.top_k <= 0
        or not query
        or policy.budget_share <= 0
        or policy.max_tokens <= 0
    ):
        return []
    shared = request.query_vector
    # The build's vector serves when recall asks the build's own query (not an explicit one).
    vector = shared.get() if shared is not None and shared.query.strip() == query[:4000] else None
    result = memory_search.memory_search(
        tenant=tenant,
        query=query[:4000],
        scope=memory_search.SearchScope(
            agent=sharing.recall_agent_scope(tenant=tenant, session=session),
            session=session.public_id,
            sessions="all",
            reader_agent=session.agent.external_id,
            loaded=session,
        ),
        limit=SEARCH_LIMIT,
        exclude_messages={(session.public_id, seq) for seq in request.window_seqs},
        query_vector=vector,
    )
    hits = [hit for hit in result.results if _relevant(hit, policy)]
    if not hits:
        return []
    best = max(_relevance(hit) for hit in hits)
    hits = [hit for hit in hits if _relevance(hit) >= best - policy.relative_gap]
    origins = sharing.recall_provenance(
        tenant=tenant, session=session, hits=[h for h in hits if h.kind != "user_memory"]
    )
    origins.update(_memory_provenance(tenant=tenant, session=session, hits=hits))
    turns = _source_turns(tenant=tenant, session=session, hits=hits, origins=origins)
    picker = _Picker(
        allowance=min(int(request.budget_tokens * policy.budget_share), policy.max_tokens),
        top_k=policy.top_k,
        count_tokens=count_tokens,
        taken={(session.public_id, seq) for seq in request.window_seqs},
    )
    for hit in hits:
        if picker.full():
            break
        origin = origins.get((hit.kind, hit.id))
        if origin is None:  # another agent's, of a kind the tenant does not share
            continue
        _pick(picker, hit, origin=origin, sources=turns.get(hit.id, []), request=request)
    return picker.items


def _pick(
    picker: _Picker,
    hit: memory_search.SearchHit,
    *,
    origin: sharing.Provenance,
    sources: list[Message],
    request: RecallRequest,
) -> None:
    """Offer one hit to the picker: a message as a turn of its session's excerpt, any other kind
    as an item, a user memory followed by the turns it was taken from."""
    current = request.session.public_id
    if hit.kind == "message":
        picker.add_turn(_Turn.of_hit(hit), hit=hit, origin=origin, current=current)
        return
    if hit.id in request.exclude_ids:
        # Already in the prompt (a user memory in the profile block, a pinned fact, …): not
        # twice. A memory's source turns are still the evidence it stands for.
        if hit.kind == "user_memory":
            for message in sources:
                picker.add_turn(_Turn.of_message(message), hit=hit, origin=origin, current=current)
        return
    item = RecalledItem(
        kind=hit.kind, id=hit.id, text=_prompt_text(hit), score=hit.relevance,
        reason=_why(hit, current), session=origin.session, seq=hit.seq,
        occurred_at=hit.occurred_at.isoformat() if hit.occurred_at else None,
        contributions=hit.contributions, agent=origin.agent,
    )  # fmt: skip
    if picker.add(item) and hit.kind == "user_memory":
        for message in sources:
            picker.add_turn(_Turn.of_message(message), hit=hit, origin=origin, current=current)


@dataclass(frozen=True)
class _Turn:
    session: str
    seq: int
    line: str  # `speaker: text`
    occurred_at: datetime | None

    @classmethod
    def of_hit(cls, hit: memory_search.SearchHit) -> _Turn:
        assert hit.session is not None and hit.seq is not None
        who = f"{hit.speaker}: " if hit.speaker else ""
        return cls(session=hit.session, seq=hit.seq, line=f"{who}{hit.text}", occurred_at=hit.occurred_at)

    @classmethod
    def of_message(cls, message: Message) -> _Turn:
        who = f"{message.name}: " if message.name else ""
        return cls(
            session=message.session.public_id,
            seq=message.seq,
            line=f"{who}{message.content}",
            occurred_at=message.occurred_at,
        )


def _excerpt_text(turns: list[_Turn]) -> str:
    """One session's recalled turns as one excerpt, in conversation order: a header with the
    session's date, then one line per turn (an ellipsis where turns were skipped)."""
    ordered = sorted(turns, key=lambda t: t.seq)
    when = ordered[0].occurred_at.strftime("%-d %B %Y") if ordered[0].occurred_at else "earlier"
    if len(ordered) == 1:
        return f"Recalled from an earlier conversation ({when}) — {ordered[0].line}"
    lines = [f"Recalled from an earlier conversation ({when}):"]
    for previous, turn in zip([None, *ordered], ordered, strict=False):
        if previous is not None and turn.seq - previous.seq > 1:
            lines.append("…")
        lines.append(turn.line)
    return "\n".join(lines)


def _relevance(hit: memory_search.SearchHit) -> float:
    # Relevance, without the length prior (ranking.py): a long but unrelated turn must not
    # clear the threshold on its length alone.
    return hit.relevance - hit.contributions.get("length", 0.0)


def _relevant(hit: memory_search.SearchHit, policy: RecallPolicy) -> bool:
    return _relevance(hit) >= policy.min_score or (
        hit.similarity is not None and hit.similarity >= policy.min_similarity
    )


@dataclass
class _Picker:
    """The recalled items so far, within the allowance and `top_k` turns or records, each turn
    once. The turns of one session share one item (one excerpt, one carried-over block), so a
    second turn of a session costs its line, not another block."""

    allowance: int
    top_k: int
    # What an item costs with `text`: the whole block it goes into the prompt as (its note and tags).
    count_tokens: Callable[[RecalledItem, str], int]
    taken: set[tuple[str, int]]
    used: int = 0
    picked: int = 0
    items: list[RecalledItem] = field(default_factory=list)
    excerpts: dict[str, tuple[RecalledItem, list[_Turn]]] = field(default_factory=dict)

    def full(self) -> bool:
        return self.picked >= self.top_k

    def add(self, item: RecalledItem) -> bool:
        cost = self.count_tokens(item, item.text)
        if self.full() or self.used + cost > self.allowance:
            return False
        self.used += cost
        self.picked += 1
        self.items.append(item)
        return True

    def add_turn(
        self, turn: _Turn, *, hit: memory_search.SearchHit, origin: sharing.Provenance, current: str
    ) -> None:
        if (turn.session, turn.seq) in self.taken or self.full():
            return
        excerpt = self.excerpts.get(turn.session)
        if excerpt is None:
            item = RecalledItem(
                kind="message", id=memory_search.message_id(turn.session, turn.seq),
                text=_excerpt_text([turn]), score=hit.relevance,
                reason=_why(hit, current) if hit.kind == "message"
                else f"recalled: the turn the user memory {hit.id} was taken from",
                session=turn.session, seq=turn.seq,
                occurred_at=turn.occurred_at.isoformat() if turn.occurred_at else None,
                contributions=hit.contributions, agent=origin.agent, seqs=[turn.seq],
            )  # fmt: skip
            if self.add(item):
                self.taken.add((turn.session, turn.seq))
                self.excerpts[turn.session] = (item, [turn])
            return
        item, turns = excerpt
        text = _excerpt_text([*turns, turn])
        cost = self.count_tokens(item, text) - self.count_tokens(item, item.text)
        if self.used + cost > self.allowance:
            return
        self.used += cost
        self.picked += 1
        self.taken.add((turn.session, turn.seq))
        turns.append(turn)
        item.text = text
        item.seqs = sorted(t.seq for t in turns)


def _memory_provenance(
    *, tenant: Tenant, session: Session, hits: list[memory_search.SearchHit]
) -> dict[tuple[str, str], sharing.Provenance | None]:
    """Where each user memory hit came from, or None when the tenant's sharing policy keeps
    another agent's (or an unbound key's) memories out of this session's builds."""
    wanted = [h.id for h in hits if h.kind == "user_memory"]
    if not wanted:
        return {}
    own = session.agent.external_id
    shared = sharing.sharing_policy_get(tenant=tenant).share_user_memories
    rows = UserMemory.objects.filter(tenant=tenant, public_id__in=wanted).values(
        "public_id", "agent", "sources"
    )
    out: dict[tuple[str, str], sharing.Provenance | None] = {}
    for row in rows:
        sources = [s for s in row["sources"] or [] if isinstance(s, dict)]
        first = str(sources[0].get("session") or "") if sources else ""
        allowed = (row["agent"] == own and bool(own)) or shared
        where = sharing.Provenance(agent=row["agent"], session=first or None)
        out[("user_memory", row["public_id"])] = where if allowed else None
    return out


def _source_turns(
    *,
    tenant: Tenant,
    session: Session,
    hits: list[memory_search.SearchHit],
    origins: dict[tuple[str, str], sharing.Provenance | None],
) -> dict[str, list[Message]]:
    """memory id → the turns its `sources` name that this session's builds may read (of its own
    agent's sessions, or any agent's when the tenant shares messages), in order; one query."""
    wanted: dict[tuple[str, int], list[str]] = {}
    for hit in hits:
        if hit.kind != "user_memory" or origins.get((hit.kind, hit.id)) is None:
            continue
        for source in (hit.sources or [])[:SOURCE_TURNS_MAX]:
            seq = source.get("seq")
            if isinstance(seq, int) and source.get("session"):
                wanted.setdefault((str(source["session"]), seq), []).append(hit.id)
    if not wanted:
        return {}
    condition = Q()
    for session_id, seq in wanted:
        condition |= Q(session__public_id=session_id, seq=seq)
    rows = Message.objects.filter(tenant=tenant).filter(condition).select_related("session")
    if not sharing.sharing_policy_get(tenant=tenant).share_messages:
        rows = rows.filter(session__agent_id=session.agent_id)
    out: dict[str, list[Message]] = {}
    for message in rows.order_by("session_id", "seq"):
        for memory_id in wanted.get((message.session.public_id, message.seq), []):
            out.setdefault(memory_id, []).append(message)
    return out
