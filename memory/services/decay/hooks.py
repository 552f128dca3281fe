"""Hooks around the context engine and the summariser: pin facts, record what a build carried, alert."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from memory.models import DecayPolicy, FactImportance, FactReference, Session, Tenant, TrackedFact
from memory.services import recorder
from memory.services.decay.facts import fact_payload
from memory.services.decay.report import fact_status
from memory.services.decay.rounds import session_round
from memory.services.decay.terms import key_terms, match_terms


@dataclass(frozen=True)
class PinnedFact:
    fact_id: str  # public id
    key: str
    content: str
    importance: str  # "high" | "medium" | "low"
    restated: bool  # True when it decayed and is being restated


def facts_for_context(*, tenant: Tenant, session: Session) -> list[PinnedFact]:
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
    match, _ = match_terms(fact.key_terms, text_terms, policy)
    return match is not None


def _alert(*, tenant: Tenant, session: Session, fact: TrackedFact, reason: str, message: str) -> None:
    recorder.event_append(
        tenant=tenant,
        type="fact.alert",
        session=session,
        payload=fact_payload(fact) | {"reason": reason, "message": message},
    )


def facts_after_build(
    *,
    tenant: Tenant,
    session: Session,
    included_fact_ids: list[str],
    dropped_fact_ids: list[str],
    prompt_text: str,
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


def facts_after_summary(
    *, tenant: Tenant, session: Session, summary_text: str, folded_seqs: list[int]
) -> list[str]:
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
