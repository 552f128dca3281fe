"""Decay detection: tracked facts, references, decay reports, restatement, session-end promotion.

CONTRACT (called by other capabilities; keep these signatures):
- facts_observe_messages: by sessions.messages_append, inside the append transaction.
- facts_for_context / facts_after_build: by the context engine around every build.
- facts_after_summary: by the summariser after it folded messages into a summary.
- facts_on_session_end: by sessions.session_end, inside its transaction.

Vocabulary. A *round* is a user turn: round N starts with the session's N-th user message, and
every message up to the next user message belongs to it. A fact is *referenced* when a message
mentions it (key-term overlap, else embedding similarity), when the agent says so explicitly,
or when a built context restates it. A fact *decays* once the session is `threshold` rounds past
its last reference (policy: 20, or 10 for high importance); each crossing records one
`fact.decayed` event, and a later reference clears it so the next crossing records another.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from memory.exceptions import DomainError, NotFound, SessionEnded
from memory.models import (
    DecayPolicy,
    FactImportance,
    FactReference,
    FactRoundCounter,
    FactScope,
    Message,
    MessageRole,
    Session,
    Tenant,
    TrackedFact,
    fact_importance_of,
)
from memory.models.decay import IMPORTANCE_RANK
from memory.services import embedding, recorder

logger = logging.getLogger(__name__)

# --- automatic registration --------------------------------------------------------------------

# A message whose event_kind is one of these registers (or updates) a tracked fact of that type.
EVENT_KIND_FACT_TYPES: dict[str, str] = {
    "decision": "decision",
    "constraint": "constraint",
    "preference": "user_preference",
    "user_preference": "user_preference",
    "goal": "goal",
    "critical_info": "critical_info",
    "project_config": "project_config",
}
# metadata key that names the fact a message registers (else the key is derived from the text)
FACT_KEY_METADATA = "fact_key"
MAX_FACT_CONTENT = 4000
DERIVED_KEY_TERMS = 6
MAX_KEY_TERMS = 12
# Fact types promoted to long-term memory at session end besides every high-importance fact.
PROMOTED_TYPES = frozenset({"user_preference", "project_config"})


@dataclass(frozen=True)
class PinnedFact:
    fact_id: str  # public id
    key: str
    content: str
    importance: str  # "high" | "medium" | "low"
    restated: bool  # True when it decayed and is being restated


# --- key terms ---------------------------------------------------------------------------------

STOPWORDS = frozenset(
    """
    a about above after again against all also always am an and any are aren as at be because been
    before being below between both but by can cannot could did didn do does doesn doing don down
    during each either else even ever every few for from further get gets got had has hasn have
    haven having he her here hers herself him himself his how however i if in into is isn it its
    itself just let like make may me might more most must my myself need needs never no nor not now
    of off often on once only or other ought our ours ourselves out over own please same shall she
    should shouldn so some such than that the their theirs them themselves then there these they
    this those through thus to too under until up upon us use used using very via was wasn we were
    weren what when where which while who whom why will with within without won would wouldn yes
    yet you your yours yourself yourselves okay ok sure thanks thank one two also really just
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def _stem(word: str) -> str:
    # A deliberately light stemmer (plurals, -ing, -ed, final -e) so "cache"/"caching"/"caches",
    # "tests"/"testing"/"tested" meet. Both sides of a comparison go through it, so it need
    # not produce real words.
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)] + keep
            break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def _words(text: str) -> list[str]:
    """The distinct content words of `text` in order (lower-cased; stop words, 1-2 letter words out)."""
    normalized = unicodedata.normalize("NFKC", text).lower()
    seen: dict[str, None] = {}
    for word in _WORD.findall(normalized):
        if (len(word) >= 3 or word.isdigit()) and word not in STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)


def key_terms(text: str) -> list[str]:
    """The distinct key terms of `text` in order: its content words, lightly stemmed."""
    return list(dict.fromkeys(_stem(word) for word in _words(text)))


def _key_phrase(key: str) -> str:
    name = key.rsplit(":", 1)[-1]
    return " ".join(_WORD.findall(name.lower()))


def _normalized_text(text: str) -> str:
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).lower()))


@dataclass
class _Match:
    method: str
    score: float


def _match_terms(
    fact_terms: list[str], message_terms: set[str], policy: DecayPolicy
) -> tuple[_Match | None, int]:
    """(a key-terms match or None, number of shared terms that are words, not numbers)."""
    if not fact_terms:
        return None, 0
    shared = sum(1 for term in fact_terms if term in message_terms)
    score = shared / len(fact_terms)
    needed = min(policy.reference_min_terms, len(fact_terms))
    if shared >= max(needed, 1) and score >= policy.reference_term_overlap:
        return _Match(FactReference.Method.KEY_TERMS, score), shared
    # A shared number alone ("round 5" vs "goal 5") is no reason to embed the message.
    return None, sum(1 for term in fact_terms if term in message_terms and not term.isdigit())


# --- embeddings (optional) ---------------------------------------------------------------------


def _embed(texts: list[str]) -> tuple[list[list[float]], str] | None:
    """Embed `texts` with the configured embedder (memory.services.embedding); None when unusable.

    Kept behind this one function so decay works (key terms only) without an embedder, or while
    an OpenAI-compatible endpoint is down: an append must never fail because of it.
    """
    try:
        embedder = embedding.embedder_get()
        vectors = embedder.embed(texts)
    except Exception:  # best effort here: key terms still work without it
        logger.warning("decay: embedding failed; falling back to key terms only", exc_info=True)
        return None
    return [[float(x) for x in vector] for vector in vectors], str(embedder.model_name)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


# --- rounds ------------------------------------------------------------------------------------


def _rounds_advance(
    *, tenant: Tenant, session: Session, user_messages: int, last_user_seq: int
) -> tuple[int, bool]:
    """Add `user_messages` rounds to the session's counter; return the new total and whether the
    session tracks any fact (one round trip: the append hot path).

    Runs under the session row lock messages_append holds, so counters never race. The first
    call counts the session's user messages (the new ones included: they are already inserted).
    """
    table, facts = FactRoundCounter._meta.db_table, TrackedFact._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET rounds = rounds + %s, last_user_seq = %s WHERE session_id = %s "
            f"RETURNING rounds, EXISTS (SELECT 1 FROM {facts} WHERE session_id = %s)",
            [user_messages, last_user_seq, session.pk, session.pk],
        )
        row = cursor.fetchone()
    if row is not None:
        return int(row[0]), bool(row[1])
    total = Message.objects.filter(session=session, role=MessageRole.USER).count()
    FactRoundCounter.objects.create(tenant=tenant, session=session, rounds=total, last_user_seq=last_user_seq)
    return total, TrackedFact.objects.filter(session=session).exists()


def _round_and_facts(*, session: Session) -> tuple[int, bool]:
    """The session's current round and whether it tracks any fact, in one round trip. Read-only."""
    table, facts = FactRoundCounter._meta.db_table, TrackedFact._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT rounds FROM {table} WHERE session_id = %s), "
            f"EXISTS (SELECT 1 FROM {facts} WHERE session_id = %s)",
            [session.pk, session.pk],
        )
        rounds, has_facts = cursor.fetchone()
    if rounds is None:
        rounds = Message.objects.filter(session=session, role=MessageRole.USER).count()
    return int(rounds), bool(has_facts)


def session_round(*, session: Session) -> int:
    """The session's current round (its number of user turns). Read-only."""
    rounds = FactRoundCounter.objects.filter(session=session).values_list("rounds", flat=True).first()
    if rounds is not None:
        return int(rounds)
    return Message.objects.filter(session=session, role=MessageRole.USER).count()


# --- registration and references ---------------------------------------------------------------


def _derive_key(fact_type: str, content: str) -> str:
    terms = _words(content)[:DERIVED_KEY_TERMS]
    slug = "-".join(terms) or "fact"
    return f"{fact_type}:{slug}"[:200]


def _fact_embedding(fact: TrackedFact, policy: DecayPolicy) -> None:
    if not policy.reference_use_embeddings:
        return
    embedded = _embed([fact.content])
    if embedded is not None:
        fact.embedding, fact.embedding_model = embedded[0][0], embedded[1]


@dataclass
class FactRegistration:
    fact: TrackedFact
    created: bool


def fact_register(
    *,
    tenant: Tenant,
    session: Session,
    key: str,
    fact_type: str,
    content: str,
    scope: str = FactScope.SESSION,
    source: str = "api",
    source_seq: int | None = None,
    round: int | None = None,
    _retry: bool = False,
) -> FactRegistration:
    """Track a fact of the session, or update the one with the same key (upsert by key).

    Registration (and re-registration) is a reference at the current round: a re-registered fact
    that had decayed is fresh again. Not idempotent in the counters (reference_count + 1) but
    safe to repeat. Records `fact.registered` (or `fact.updated`). Raises SessionEnded when the
    session is no longer open; the view validates the fields.
    """
    if not session.is_live:
        raise SessionEnded(details={"session": session.public_id})
    now = timezone.now()
    policy = DecayPolicy.for_tenant(tenant)
    current = session_round(session=session) if round is None else round
    content = content[:MAX_FACT_CONTENT]
    importance = fact_importance_of(fact_type)
    with transaction.atomic():
        fact = TrackedFact.objects.select_for_update().filter(session=session, key=key).first()
        created = fact is None
        if fact is None:
            fact = TrackedFact(
                tenant=tenant,
                session=session,
                key=key,
                registered_round=current,
                created_at=now,
            )
        changed = created or fact.content != content
        fact.fact_type = fact_type
        fact.importance = importance
        fact.content = content
        fact.scope = scope
        fact.user_id = session.user_id
        fact.source = source if created else fact.source
        fact.source_seq = source_seq if source_seq is not None else fact.source_seq
        fact.key_terms = key_terms(content)[:MAX_KEY_TERMS]
        fact.last_referenced_round = current
        fact.last_referenced_at = now
        fact.reference_count = (fact.reference_count or 0) + 1
        fact.decayed, fact.decayed_round, fact.decayed_at = False, None, None
        fact.updated_at = now
        if changed:
            fact.embedding, fact.embedding_model = None, ""
            _fact_embedding(fact, policy)
        try:
            with transaction.atomic():  # a savepoint: a concurrent first registration of this key wins
                fact.save()
        except IntegrityError:
            if not created or _retry:
                raise
            return fact_register(
                tenant=tenant,
                session=session,
                key=key,
                fact_type=fact_type,
                content=content,
                scope=scope,
                source=source,
                source_seq=source_seq,
                round=round,
                _retry=True,
            )
        FactReference.objects.create(
            tenant=tenant,
            fact=fact,
            round=current,
            method=FactReference.Method.REGISTERED,
            message_seq=source_seq,
            created_at=now,
        )
        recorder.event_append(
            tenant=tenant,
            type="fact.registered" if created else "fact.updated",
            session=session,
            payload=_fact_payload(fact) | {"source": source},
        )
    return FactRegistration(fact=fact, created=created)


def _fact_payload(fact: TrackedFact) -> dict[str, Any]:
    return {
        "fact": fact.public_id,
        "key": fact.key,
        "type": fact.fact_type,
        "importance": fact.importance,
        "round": fact.last_referenced_round,
    }


def fact_get(*, tenant: Tenant, session: Session, fact_id: str) -> TrackedFact:
    """The session's fact, or NotFound (identical for a missing id and another tenant's)."""
    fact = TrackedFact.objects.filter(tenant=tenant, session=session, public_id=fact_id).first()
    if fact is None:
        raise NotFound.of("fact", fact_id)
    return fact


def fact_reference(*, tenant: Tenant, session: Session, fact: TrackedFact, note: str = "") -> TrackedFact:
    """Mark the fact referenced now (explicitly, by the agent). Clears a decay crossing.

    Records `fact.referenced`. Repeating it in the same round changes only the count. Raises
    SessionEnded when the session is no longer open.
    """
    if not session.is_live:
        raise SessionEnded(details={"session": session.public_id})
    now = timezone.now()
    current = session_round(session=session)
    with transaction.atomic():
        TrackedFact.objects.filter(pk=fact.pk).update(
            last_referenced_round=current,
            last_referenced_at=now,
            reference_count=F("reference_count") + 1,
            decayed=False,
            decayed_round=None,
            decayed_at=None,
            updated_at=now,
        )
        FactReference.objects.create(
            tenant=tenant, fact=fact, round=current, method=FactReference.Method.EXPLICIT, created_at=now
        )
        fact.refresh_from_db()
        recorder.event_append(
            tenant=tenant,
            type="fact.referenced",
            session=session,
            payload=_fact_payload(fact) | {"note": note[:500]},
        )
    return fact


def fact_delete(*, tenant: Tenant, session: Session, fact: TrackedFact) -> None:
    """Stop tracking the fact (its reference history goes with it). Records `fact.deleted`."""
    with transaction.atomic():
        payload = _fact_payload(fact)
        fact.delete()
        recorder.event_append(tenant=tenant, type="fact.deleted", session=session, payload=payload)


def facts_observe_messages(*, tenant: Any, session: Any, messages: list[Any]) -> None:
    """Advance the round counter, register facts from marked messages, detect references, sweep decay.

    Runs inside messages_append's transaction (under the session row lock), on every append, so it
    is cheap: one counter UPDATE when the batch has user messages, one SELECT of the session's facts,
    and writes only for what changed. Embedding a message happens only when it shares some key
    terms with a fact without reaching the overlap threshold (and the policy allows embeddings).
    Records `fact.registered`/`fact.updated` for auto-registered facts and `fact.decayed` per crossing.
    """
    if not messages:
        return
    ordered = sorted(messages, key=lambda m: m.seq)
    user_seqs = [m.seq for m in ordered if m.role == MessageRole.USER]
    if user_seqs:
        total, has_facts = _rounds_advance(
            tenant=tenant, session=session, user_messages=len(user_seqs), last_user_seq=user_seqs[-1]
        )
    else:
        total, has_facts = _round_and_facts(session=session)
    start = total - len(user_seqs)
    rounds: dict[int, int] = {}
    current = start
    for message in ordered:
        if message.role == MessageRole.USER:
            current += 1
        rounds[message.seq] = current

    registering = [m for m in ordered if m.event_kind in EVENT_KIND_FACT_TYPES and m.content.strip()]
    if not has_facts and not registering:  # most appends: nothing to observe, no further query
        return
    facts = _facts_to_observe(session)
    policy = DecayPolicy.for_tenant(tenant)
    registered_by: dict[int, int] = {}
    if registering and policy.auto_register:
        for message in registering:
            fact_type = EVENT_KIND_FACT_TYPES[message.event_kind]
            metadata = message.metadata if isinstance(message.metadata, dict) else {}
            key = str(metadata.get(FACT_KEY_METADATA) or "").strip()[:200] or _derive_key(
                fact_type, message.content
            )
            registration = fact_register(
                tenant=tenant,
                session=session,
                key=key,
                fact_type=fact_type,
                content=message.content.strip(),
                source="message",
                source_seq=message.seq,
                round=rounds[message.seq],
            )
            registered_by[registration.fact.pk] = message.seq
        facts = _facts_to_observe(session)
    if not facts:
        return
    referenced = _detect_references(
        tenant=tenant,
        policy=policy,
        facts=facts,
        messages=ordered,
        rounds=rounds,
        registered_by=registered_by,
    )
    # The sweep's locking query runs only when a fact is about to cross (most appends: none).
    if user_seqs and any(
        not fact.decayed
        and fact.pk not in referenced
        and total - fact.last_referenced_round >= policy.threshold_for(fact.importance)
        for fact in facts
    ):
        decay_sweep(tenant=tenant, session=session, policy=policy, current_round=total)


def _facts_to_observe(session: Session) -> list[TrackedFact]:
    # Only what detection reads: a fact's embedding (384 floats of JSON) is fetched on demand,
    # in the rare case that needs it, not on every append.
    return list(
        TrackedFact.objects.filter(session=session).only(
            "pk", "key", "key_terms", "importance", "embedding_model", "last_referenced_round", "decayed"
        )
    )


def _detect_references(
    *,
    tenant: Tenant,
    policy: DecayPolicy,
    facts: list[TrackedFact],
    messages: list[Message],
    rounds: dict[int, int],
    registered_by: dict[int, int],
) -> set[int]:
    """Key terms first; embeddings only for the (message, fact) pairs key terms left undecided.

    Those pairs cost one query for the facts' stored vectors and one embedder call for the
    messages, per batch. Returns the pks of the referenced facts.
    """
    now = timezone.now()
    found: list[tuple[Message, TrackedFact, _Match]] = []
    undecided: list[tuple[Message, TrackedFact]] = []
    for message in messages:
        text = message.content or ""
        if not text.strip():
            continue
        terms = set(key_terms(text))
        normalized = f" {_normalized_text(text)} "
        for fact in facts:
            if registered_by.get(fact.pk) == message.seq:
                continue  # the message that registered the fact is not a later reference to it
            match, shared = _match_terms(fact.key_terms, terms, policy)
            if match is None:
                phrase = _key_phrase(fact.key)
                if len(phrase) >= 4 and f" {phrase} " in normalized:
                    match = _Match(FactReference.Method.KEY_TERMS, 1.0)
            if match is not None:
                found.append((message, fact, match))
            elif shared and policy.reference_use_embeddings and fact.embedding_model:
                undecided.append((message, fact))
    if undecided:
        found += _match_embeddings(undecided, policy)
    if not found:
        return set()
    references: list[FactReference] = []
    latest: dict[int, int] = {}
    counts: dict[int, int] = {}
    for message, fact, match in found:
        round_ = rounds[message.seq]
        references.append(
            FactReference(
                tenant=tenant,
                fact=fact,
                round=round_,
                method=match.method,
                message_seq=message.seq,
                score=round(match.score, 4),
                created_at=now,
            )
        )
        latest[fact.pk] = max(latest.get(fact.pk, 0), round_)
        counts[fact.pk] = counts.get(fact.pk, 0) + 1
    FactReference.objects.bulk_create(references)
    for fact_pk, round_ in latest.items():
        TrackedFact.objects.filter(pk=fact_pk).update(
            last_referenced_round=round_,
            last_referenced_at=now,
            reference_count=F("reference_count") + counts[fact_pk],
            decayed=False,
            decayed_round=None,
            decayed_at=None,
            updated_at=now,
        )
    return set(latest)


def _match_embeddings(
    pairs: list[tuple[Message, TrackedFact]], policy: DecayPolicy
) -> list[tuple[Message, TrackedFact, _Match]]:
    rows = TrackedFact.objects.filter(pk__in={fact.pk for _, fact in pairs}).values_list("pk", "embedding")
    fact_vectors: dict[int, list[float]] = {pk: vector for pk, vector in rows if vector}
    texts = list(dict.fromkeys(message.content for message, fact in pairs if fact.pk in fact_vectors))
    if not texts:
        return []
    embedded = _embed(texts)
    if embedded is None:
        return []
    message_vectors = dict(zip(texts, embedded[0], strict=True))
    matches = []
    for message, fact in pairs:
        if fact.pk not in fact_vectors:
            continue
        similarity = _cosine(fact_vectors[fact.pk], message_vectors[message.content])
        if similarity >= policy.reference_similarity:
            matches.append((message, fact, _Match(FactReference.Method.EMBEDDING, similarity)))
    return matches


def decay_sweep(
    *, tenant: Tenant, session: Session, policy: DecayPolicy, current_round: int
) -> list[TrackedFact]:
    """Mark the session's facts that crossed their decay threshold; one `fact.decayed` event each.

    Must run inside a transaction. Idempotent: an already decayed fact is not marked again.
    Returns the newly decayed facts.
    """
    crossing = Q(
        importance=FactImportance.HIGH, last_referenced_round__lte=current_round - policy.decay_rounds_high
    )
    crossing |= ~Q(importance=FactImportance.HIGH) & Q(
        last_referenced_round__lte=current_round - policy.decay_rounds
    )
    candidates = list(
        TrackedFact.objects.select_for_update()
        .filter(tenant=tenant, session=session, decayed=False)
        .filter(crossing)
    )
    if not candidates:
        return []
    now = timezone.now()
    for fact in candidates:
        fact.decayed = True
        fact.decayed_round = fact.last_referenced_round + policy.threshold_for(fact.importance)
        fact.decayed_at = now
        fact.decay_count += 1
        fact.updated_at = now
    TrackedFact.objects.bulk_update(
        candidates, ["decayed", "decayed_round", "decayed_at", "decay_count", "updated_at"]
    )
    recorder.event_append_many(
        tenant=tenant,
        type="fact.decayed",
        session=session,
        payloads=[
            {
                "fact": fact.public_id,
                "key": fact.key,
                "importance": fact.importance,
                "last_referenced_round": fact.last_referenced_round,
                "decayed_round": fact.decayed_round,
                "round": current_round,
                "recommendation": recommendation_for(fact.importance, decayed=True),
            }
            for fact in candidates
        ],
    )
    return candidates


# --- the decay report --------------------------------------------------------------------------

RESTATE_NOW = "restate_now"
CONSIDER_RESTATING = "consider_restating"
NO_ACTION = "no_action"


def recommendation_for(importance: str, *, decayed: bool) -> str:
    if not decayed:
        return NO_ACTION
    if importance == FactImportance.HIGH:
        return RESTATE_NOW
    if importance == FactImportance.MEDIUM:
        return CONSIDER_RESTATING
    return NO_ACTION


@dataclass(frozen=True)
class FactStatus:
    fact: TrackedFact
    round: int
    threshold: int
    rounds_since_reference: int
    decayed: bool
    decayed_round: int | None
    recommendation: str


def fact_status(*, fact: TrackedFact, policy: DecayPolicy, current_round: int) -> FactStatus:
    """A fact's decay state at `current_round` under the current policy. Pure."""
    threshold = policy.threshold_for(fact.importance)
    since = max(0, current_round - fact.last_referenced_round)
    decayed = since >= threshold
    return FactStatus(
        fact=fact,
        round=current_round,
        threshold=threshold,
        rounds_since_reference=since,
        decayed=decayed,
        decayed_round=(fact.last_referenced_round + threshold) if decayed else None,
        recommendation=recommendation_for(fact.importance, decayed=decayed),
    )


def facts_list(
    *,
    tenant: Tenant,
    session: Session,
    decayed: bool | None = None,
    importance: str | None = None,
) -> tuple[int, list[FactStatus]]:
    """The session's facts with their decay state (the decay report when decayed=True). Read-only.

    Returns (current round, statuses), most urgent first: decayed before fresh, then by
    importance, then longest unreferenced. The state is computed from the current policy, so it
    is right even between appends after a policy change.
    """
    policy = DecayPolicy.for_tenant(tenant)
    current = session_round(session=session)
    queryset = TrackedFact.objects.filter(tenant=tenant, session=session)
    if importance:
        queryset = queryset.filter(importance=importance)
    statuses = [fact_status(fact=fact, policy=policy, current_round=current) for fact in queryset]
    if decayed is not None:
        statuses = [status for status in statuses if status.decayed == decayed]
    statuses.sort(
        key=lambda s: (
            not s.decayed,
            IMPORTANCE_RANK[s.fact.importance],
            -s.rounds_since_reference,
            s.fact.pk,
        )
    )
    return current, statuses


def fact_references(*, fact: TrackedFact, limit: int = 50) -> list[FactReference]:
    """The fact's latest references, newest first. Read-only."""
    return list(fact.references.order_by("-pk")[:limit])


# --- restatement, build and summary checks -----------------------------------------------------


def facts_for_context(*, tenant: Any, session: Any) -> list[PinnedFact]:
    """The facts to pin at the start of the next built context, most important first. Read-only.

    Decayed high-importance facts come first (restated=True), then — when the policy pins them
    (default) — every other high-importance fact, then decayed medium-importance facts when the
    policy restates them (default off). Ordered oldest reference first within each group.
    """
    policy = DecayPolicy.for_tenant(tenant)
    current = session_round(session=session)
    facts = TrackedFact.objects.filter(tenant=tenant, session=session).exclude(importance=FactImportance.LOW)
    restated: list[tuple[int, TrackedFact]] = []
    pinned: list[tuple[int, TrackedFact]] = []
    for fact in facts:
        status = fact_status(fact=fact, policy=policy, current_round=current)
        if fact.importance == FactImportance.HIGH:
            (restated if status.decayed else pinned).append((0 if status.decayed else 1, fact))
            if not status.decayed and not policy.pin_high_importance:
                pinned.pop()
        elif status.decayed and policy.restate_medium:
            restated.append((2, fact))
    chosen = sorted(restated + pinned, key=lambda item: (item[0], item[1].last_referenced_round, item[1].pk))
    return [
        PinnedFact(
            fact_id=fact.public_id,
            key=fact.key,
            content=fact.content,
            importance=fact.importance,
            restated=group != 1,
        )
        for group, fact in chosen
    ]


def _text_covers(fact: TrackedFact, text_terms: set[str], policy: DecayPolicy) -> bool:
    match, _ = _match_terms(fact.key_terms, text_terms, policy)
    return match is not None


def _alert(*, tenant: Tenant, session: Session, fact: TrackedFact, reason: str, message: str) -> None:
    recorder.event_append(
        tenant=tenant,
        type="fact.alert",
        session=session,
        payload=_fact_payload(fact) | {"reason": reason, "message": message},
    )


def facts_after_build(
    *, tenant: Any, session: Any, included_fact_ids: list[str], dropped_fact_ids: list[str], prompt_text: str
) -> list[str]:
    """Record which facts a built context carried (references, injections); return warnings.

    Every included fact gets its last injected round/time; an included fact that had decayed is
    restated, which counts as a reference at the current round. A dropped high-importance fact
    whose content the prompt does not otherwise carry (key-term check) is an alert: a returned
    warning and a `fact.alert` event (reason `dropped_from_context`). Unknown ids are ignored.
    """
    if not included_fact_ids and not dropped_fact_ids:
        return []
    policy = DecayPolicy.for_tenant(tenant)
    current = session_round(session=session)
    now = timezone.now()
    warnings: list[str] = []
    with transaction.atomic():
        included = list(
            TrackedFact.objects.select_for_update().filter(
                tenant=tenant, session=session, public_id__in=included_fact_ids
            )
        )
        restated_refs = []
        for fact in included:
            fact.last_injected_round, fact.last_injected_at = current, now
            fact.injection_count += 1
            fact.updated_at = now
            if fact_status(fact=fact, policy=policy, current_round=current).decayed or fact.decayed:
                fact.last_referenced_round, fact.last_referenced_at = current, now
                fact.reference_count += 1
                fact.decayed, fact.decayed_round, fact.decayed_at = False, None, None
                restated_refs.append(
                    FactReference(
                        tenant=tenant,
                        fact=fact,
                        round=current,
                        method=FactReference.Method.RESTATED,
                        created_at=now,
                    )
                )
        if included:
            TrackedFact.objects.bulk_update(
                included,
                [
                    "last_injected_round",
                    "last_injected_at",
                    "injection_count",
                    "updated_at",
                    "last_referenced_round",
                    "last_referenced_at",
                    "reference_count",
                    "decayed",
                    "decayed_round",
                    "decayed_at",
                ],
            )
            FactReference.objects.bulk_create(restated_refs)
        dropped = TrackedFact.objects.filter(
            tenant=tenant, session=session, public_id__in=dropped_fact_ids, importance=FactImportance.HIGH
        ).exclude(public_id__in=included_fact_ids)
        prompt_terms = set(key_terms(prompt_text)) if dropped_fact_ids else set()
        for fact in dropped:
            if _text_covers(fact, prompt_terms, policy):
                continue
            message = (
                f"High-importance fact {fact.key!r} ({fact.public_id}) was dropped from the assembled "
                "context; raise the budget or shorten other parts so it fits."
            )
            warnings.append(message)
            _alert(tenant=tenant, session=session, fact=fact, reason="dropped_from_context", message=message)
    return warnings


def facts_after_summary(*, tenant: Any, session: Any, summary_text: str, folded_seqs: list[int]) -> list[str]:
    """Check that no high-importance fact was lost from a new summary; return alerts.

    The facts checked are the high-importance ones stated in a folded message (the message that
    registered it, or one that referenced it). One whose key terms the summary does not carry
    (same overlap rule as references) is lost: a returned warning and a `fact.alert` event
    (reason `lost_from_summary`). Writes only the events.
    """
    if not folded_seqs:
        return []
    policy = DecayPolicy.for_tenant(tenant)
    folded = set(folded_seqs)
    low, high = min(folded), max(folded)
    facts = TrackedFact.objects.filter(tenant=tenant, session=session, importance=FactImportance.HIGH)
    referenced_in_folded = set(
        FactReference.objects.filter(
            fact__session=session, message_seq__gte=low, message_seq__lte=high
        ).values_list("fact_id", "message_seq")
    )
    stated = {fact_id for fact_id, seq in referenced_in_folded if seq in folded}
    summary_terms = set(key_terms(summary_text))
    warnings: list[str] = []
    with transaction.atomic():
        for fact in facts:
            if fact.pk not in stated and fact.source_seq not in folded:
                continue
            if _text_covers(fact, summary_terms, policy):
                continue
            message = (
                f"High-importance fact {fact.key!r} ({fact.public_id}) is not in the new summary; "
                "it stays pinned, but check the summariser."
            )
            warnings.append(message)
            _alert(tenant=tenant, session=session, fact=fact, reason="lost_from_summary", message=message)
    return warnings


def facts_embed_missing(*, limit: int = 500) -> int:
    """Embed facts whose embedding is missing (the embedder was down at registration).

    Only tenants whose policy uses embeddings. Idempotent; returns the number embedded.
    """
    facts = list(
        TrackedFact.objects.filter(embedding__isnull=True)
        .filter(tenant__in=DecayPolicy.objects.filter(reference_use_embeddings=True).values("tenant"))
        .order_by("pk")[:limit]
    )
    if not facts:
        return 0
    embedded = _embed([fact.content for fact in facts])
    if embedded is None:
        return 0
    vectors, model = embedded
    for fact, vector in zip(facts, vectors, strict=True):
        fact.embedding, fact.embedding_model = vector, model
    TrackedFact.objects.bulk_update(facts, ["embedding", "embedding_model"])
    return len(facts)


# --- session end -------------------------------------------------------------------------------

# Fact type → the experience kind experiences_promote accepts.
PROMOTION_KINDS: dict[str, str] = {
    "user_preference": "preference",
    "project_config": "project_config",
    "constraint": "constraint",
    "goal": "fact",
    "critical_info": "fact",
}


@dataclass
class PromotionResult:
    promoted: list[str] = field(default_factory=list)  # fact public ids
    skipped: list[str] = field(default_factory=list)  # fact public ids not promotable
    reason: str = ""  # why nothing was promoted, when so


def facts_to_promote(*, session: Session) -> list[TrackedFact]:
    """High-importance facts, user preferences and project configuration not yet promoted. Read-only."""
    return list(
        TrackedFact.objects.filter(session=session, promoted_at__isnull=True)
        .filter(Q(importance=FactImportance.HIGH) | Q(fact_type__in=PROMOTION_KINDS))
        .order_by("pk")
    )


def facts_on_session_end(*, tenant: Any, session: Any) -> None:
    """Promote high-importance facts, preferences and project configuration to long-term memory.

    Runs inside session_end's transaction. See facts_promote.
    """
    facts_promote(tenant=tenant, session=session)


def facts_promote(*, tenant: Tenant, session: Session) -> PromotionResult:
    """Promote the session's promotable facts through experiences.experiences_promote.

    user_preference → `preference`, project_config → `project_config`, constraint → `constraint`
    (user-scoped when the session has a user id, tenant-wide otherwise). Other high-importance
    types (goal, critical_info) have no long-term kind and are skipped. Each promoted fact gets
    `promoted_at` and a `fact.promoted` event, so a second call promotes nothing twice
    (idempotent). A fact the promotion refuses is logged and skipped: ending a session never
    fails because of it.
    """
    facts = facts_to_promote(session=session)
    if not facts:
        return PromotionResult(reason="nothing to promote")
    from memory.services.experiences import experiences_promote  # experiences imports decay

    result = PromotionResult()
    now = timezone.now()
    with transaction.atomic():
        for fact in facts:
            kind = PROMOTION_KINDS.get(fact.fact_type)
            if kind is None:
                result.skipped.append(fact.public_id)
                continue
            try:
                with transaction.atomic():  # a savepoint: a refused fact leaves nothing behind
                    created = experiences_promote(
                        tenant=tenant,
                        user_id=session.user_id,
                        kind=kind,
                        key=fact.key,
                        content=fact.content,
                        source=f"fact:{fact.public_id}",
                        session=session,
                    )
            except DomainError:
                logger.warning("decay: promotion of %s refused", fact.public_id, exc_info=True)
                result.skipped.append(fact.public_id)
                continue
            experience_id = str(getattr(created.experience, "public_id", ""))
            fact.promoted_at, fact.promoted_ref = now, experience_id
            fact.save(update_fields=["promoted_at", "promoted_ref"])
            recorder.event_append(
                tenant=tenant,
                type="fact.promoted",
                session=session,
                payload=_fact_payload(fact) | {"experience": experience_id, "kind": kind},
            )
            result.promoted.append(fact.public_id)
    return result
