"""Tracked facts: register (upsert by key), get, reference explicitly, delete, embed the missing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from memory.exceptions import NotFound, SessionEnded
from memory.models import (
    DecayPolicy,
    FactReference,
    FactScope,
    Session,
    Tenant,
    TrackedFact,
    fact_importance_of,
)
from memory.services import recorder
from memory.services.decay.rounds import session_round
from memory.services.decay.terms import embed, key_terms, words

MAX_FACT_CONTENT = 4000
DERIVED_KEY_TERMS = 6
MAX_KEY_TERMS = 12


def derive_key(fact_type: str, content: str) -> str:
    terms = words(content)[:DERIVED_KEY_TERMS]
    slug = "-".join(terms) or "fact"
    return f"{fact_type}:{slug}"[:200]


def _fact_embedding(fact: TrackedFact, policy: DecayPolicy) -> None:
    if not policy.reference_use_embeddings:
        return
    embedded = embed([fact.content])
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
            payload=fact_payload(fact) | {"source": source},
        )
    return FactRegistration(fact=fact, created=created)


def fact_payload(fact: TrackedFact) -> dict[str, Any]:
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
            payload=fact_payload(fact) | {"note": note[:500]},
        )
    return fact


def fact_delete(*, tenant: Tenant, session: Session, fact: TrackedFact) -> None:
    """Stop tracking the fact (its reference history goes with it). Records `fact.deleted`."""
    with transaction.atomic():
        payload = fact_payload(fact)
        fact.delete()
        recorder.event_append(tenant=tenant, type="fact.deleted", session=session, payload=payload)


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
    embedded = embed([fact.content for fact in facts])
    if embedded is None:
        return 0
    vectors, model = embedded
    for fact, vector in zip(facts, vectors, strict=True):
        fact.embedding, fact.embedding_model = vector, model
    TrackedFact.objects.bulk_update(facts, ["embedding", "embedding_model"])
    return len(facts)
