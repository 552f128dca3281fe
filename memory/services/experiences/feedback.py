"""Use and outcome reports: what ranking learns from agents."""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from memory.models import Experience, ExperienceFeedback, Session, Tenant
from memory.services import recorder
from memory.services.experiences.records import event_payload


def experiences_touch(*, tenant: Tenant, experience_ids: list[str]) -> int:
    """Count one use of each experience (use count + 1, last used = now). Returns rows touched."""
    if not experience_ids:
        return 0
    return Experience.objects.filter(tenant=tenant, public_id__in=experience_ids).update(
        use_count=F("use_count") + 1, last_used_at=timezone.now()
    )


def experience_feedback(
    *, tenant: Tenant, experience: Experience, helpful: bool, note: str = "", session: Session | None = None
) -> Experience:
    """Record an agent's outcome report; ranking uses helpful - unhelpful. Not idempotent (each call counts).

    Records `experience.feedback`.
    """
    field = "helpful_count" if helpful else "unhelpful_count"
    with transaction.atomic():
        # The stream before the experience's row: recorder.streams_lock's rule.
        recorder.stream_lock(tenant=tenant, session=session)
        ExperienceFeedback.objects.create(
            tenant=tenant, experience=experience, helpful=helpful, note=note, session=session
        )
        Experience.objects.filter(pk=experience.pk).update(**{field: F(field) + 1})
        experience.refresh_from_db(fields=["helpful_count", "unhelpful_count"])
        recorder.event_append(
            tenant=tenant,
            type="experience.feedback",
            session=session,
            payload=event_payload(experience, helpful=helpful, note=note[:500]),
        )
    return experience
