"""Session end: promote high-importance facts, preferences and project configuration to experiences."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from memory.exceptions import DomainError
from memory.models import FactImportance, Session, Tenant, TrackedFact
from memory.services import recorder
from memory.services.decay.facts import fact_payload
from memory.services.experiences import experiences_promote

logger = logging.getLogger(__name__)

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
    """High-importance facts, user preferences and project configuration not yet promoted. Read-only.

    In the order of (type, key): promoting locks each one's experience, and sessions promoting
    facts of the same keys must lock them in one order (memory.services.sessions.session_end).
    """
    return list(
        TrackedFact.objects.filter(session=session, promoted_at__isnull=True)
        .filter(Q(importance=FactImportance.HIGH) | Q(fact_type__in=PROMOTION_KINDS))
        .order_by("fact_type", "key", "pk")
    )


def facts_on_session_end(*, tenant: Tenant, session: Session) -> None:
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
                payload=fact_payload(fact) | {"experience": experience_id, "kind": kind},
            )
            result.promoted.append(fact.public_id)
    return result
