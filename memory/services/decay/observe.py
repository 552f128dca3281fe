"""Observing appended messages: advance rounds, auto-register facts, detect references, sweep decay."""

from __future__ import annotations

from django.db.models import F, Q
from django.utils import timezone

from memory.models import (
    DecayPolicy,
    FactImportance,
    FactReference,
    Message,
    MessageRole,
    Session,
    Tenant,
    TrackedFact,
)
from memory.services import recorder
from memory.services.decay.facts import derive_key, fact_register
from memory.services.decay.report import recommendation_for
from memory.services.decay.rounds import round_and_facts, rounds_advance
from memory.services.decay.terms import (
    Match,
    cosine,
    embed,
    key_phrase,
    key_terms,
    match_terms,
    normalized_text,
)

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


def facts_observe_messages(
    *,
    tenant: Tenant,
    session: Session,
    messages: list[Message],
    progress: tuple[int | None, bool] | None = None,
) -> None:
    """Advance the round counter, register facts from marked messages, detect references, sweep decay.

    Runs inside messages_append's transaction (under the session row lock), on every append, so it
    is cheap: one counter UPDATE when the batch has user messages, one SELECT of the session's facts,
    and writes only for what changed. Embedding a message happens only when it shares some key
    terms with a fact without reaching the overlap threshold (and the policy allows embeddings).
    Records `fact.registered`/`fact.updated` for auto-registered facts and `fact.decayed` per crossing.
    `progress` is (the session's round after these messages, whether it tracks any fact) when the
    caller already advanced the counter in its own statement (messages_append); a round of None
    (no counter row yet) falls back to advancing it here.
    """
    if not messages:
        return
    ordered = sorted(messages, key=lambda m: m.seq)
    user_seqs = [m.seq for m in ordered if m.role == MessageRole.USER]
    if progress is not None and progress[0] is not None:
        total, has_facts = int(progress[0]), progress[1]
    elif user_seqs:
        total, has_facts = rounds_advance(
            tenant=tenant, session=session, user_messages=len(user_seqs), last_user_seq=user_seqs[-1]
        )
    else:
        total, has_facts = round_and_facts(session=session)
    rounds = _message_rounds(ordered, start=total - len(user_seqs))
    registering = [m for m in ordered if m.event_kind in EVENT_KIND_FACT_TYPES and m.content.strip()]
    if not has_facts and not registering:  # most appends: nothing to observe, no further query
        return
    facts = _facts_to_observe(session)
    policy = DecayPolicy.for_tenant(tenant)
    registered_by: dict[int, int] = {}
    if registering and policy.auto_register:
        registered_by = _register_marked(tenant=tenant, session=session, messages=registering, rounds=rounds)
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


def _message_rounds(ordered: list[Message], *, start: int) -> dict[int, int]:
    """seq → round for messages in seq order, the first of them following round `start`."""
    rounds: dict[int, int] = {}
    current = start
    for message in ordered:
        if message.role == MessageRole.USER:
            current += 1
        rounds[message.seq] = current
    return rounds


def _register_marked(
    *, tenant: Tenant, session: Session, messages: list[Message], rounds: dict[int, int]
) -> dict[int, int]:
    """Register (or update) the fact each marked message states; return fact pk → message seq."""
    registered_by: dict[int, int] = {}
    for message in messages:
        fact_type = EVENT_KIND_FACT_TYPES[message.event_kind]
        metadata = message.metadata if isinstance(message.metadata, dict) else {}
        named = str(metadata.get(FACT_KEY_METADATA) or "").strip()[:200]
        key = named or derive_key(fact_type, message.content)
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
    return registered_by


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
    found: list[tuple[Message, TrackedFact, Match]] = []
    undecided: list[tuple[Message, TrackedFact]] = []
    for message in messages:
        text = message.content or ""
        if not text.strip():
            continue
        terms = set(key_terms(text))
        normalized = f" {normalized_text(text)} "
        for fact in facts:
            if registered_by.get(fact.pk) == message.seq:
                continue  # the message that registered the fact is not a later reference to it
            match, shared = match_terms(fact.key_terms, terms, policy)
            if match is None:
                phrase = key_phrase(fact.key)
                if len(phrase) >= 4 and f" {phrase} " in normalized:
                    match = Match(FactReference.Method.KEY_TERMS, 1.0)
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
) -> list[tuple[Message, TrackedFact, Match]]:
    rows = TrackedFact.objects.filter(pk__in={fact.pk for _, fact in pairs}).values_list("pk", "embedding")
    fact_vectors: dict[int, list[float]] = {pk: vector for pk, vector in rows if vector}
    texts = list(dict.fromkeys(message.content for message, fact in pairs if fact.pk in fact_vectors))
    if not texts:
        return []
    embedded = embed(texts)
    if embedded is None:
        return []
    message_vectors = dict(zip(texts, embedded[0], strict=True))
    matches = []
    for message, fact in pairs:
        if fact.pk not in fact_vectors:
            continue
        similarity = cosine(fact_vectors[fact.pk], message_vectors[message.content])
        if similarity >= policy.reference_similarity:
            matches.append((message, fact, Match(FactReference.Method.EMBEDDING, similarity)))
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
    recorder.events_append(
        tenant=tenant,
        session=session,
        entries=[
            (
                "fact.decayed",
                {
                    "fact": fact.public_id,
                    "key": fact.key,
                    "importance": fact.importance,
                    "last_referenced_round": fact.last_referenced_round,
                    "decayed_round": fact.decayed_round,
                    "round": current_round,
                    "recommendation": recommendation_for(fact.importance, decayed=True),
                },
            )
            for fact in candidates
        ],
    )
    return candidates
