"""The decay report: each fact's state at the current round, computed from the current policy."""

from __future__ import annotations

from dataclasses import dataclass

from memory.models import DecayPolicy, FactImportance, FactReference, Session, Tenant, TrackedFact
from memory.models.decay import IMPORTANCE_RANK
from memory.services.decay.rounds import session_round

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
