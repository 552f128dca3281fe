"""Promotion to long-term memory: user preferences, project configuration, constraints, facts."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.exceptions import InvalidInput
from memory.models import Experience, ExperienceKind, ExperienceScope, ExtractionMethod, Session, Tenant
from memory.services import recorder
from memory.services.experiences.create import experience_create
from memory.services.experiences.reads import visible_filter
from memory.services.experiences.records import (
    KIND_LABELS,
    PROMOTABLE_KINDS,
    CreateResult,
    boosted_confidence,
    provenance_entry,
)


def experiences_promote(
    *,
    tenant: Tenant,
    user_id: str,
    kind: str,
    key: str,
    content: str,
    source: Any = None,
    session: Session | None = None,
    confidence: float = 0.9,
    agent: str = "",
) -> CreateResult:
    """Promote a user preference, project configuration or constraint to long-term memory.

    User-scoped when `user_id` is given, tenant-wide otherwise. Idempotent for the same content
    (outcome "unchanged": confidence nudged up, provenance appended only for a new source); a new
    content for the same (user, kind, key) supersedes the old value (outcome "created", the old
    one kept and linked). `agent` (a key bound to it) records the value as that agent's, and
    confirms or supersedes only that agent's value of the key. Raises InvalidInput for another
    kind or an empty key / content.
    """
    if kind not in PROMOTABLE_KINDS:
        raise InvalidInput(
            f"kind must be one of {', '.join(sorted(PROMOTABLE_KINDS))}.",
            details={"fields": {"kind": ["Not promotable."]}},
        )
    key, content = key.strip(), content.strip()
    if not key or not content:
        field = "key" if not key else "content"
        raise InvalidInput(f"{field} must not be empty.", details={"fields": {field: ["Required."]}})
    scope = ExperienceScope.USER if user_id else ExperienceScope.TENANT
    with transaction.atomic():
        # The stream before the promoted row: recorder.streams_lock's rule.
        recorder.stream_lock(tenant=tenant, session=session)
        current = (
            Experience.objects.select_for_update()
            .filter(tenant=tenant, kind=kind, user_id=user_id, scope=scope, key=key, agent=agent)
            .filter(visible_filter())
            .order_by("-created_at")
            .first()
        )
        if current is not None and current.solution == content:
            return _confirm(current, source=source, session=session)
        return experience_create(
            tenant=tenant, problem=f"{KIND_LABELS[ExperienceKind(kind)]} ({key})", solution=content,
            confidence=confidence, extraction_method=ExtractionMethod.PROMOTED, user_id=user_id,
            scope=scope, kind=kind, key=key, source_session=session, source=source, supersedes=current,
            agent=agent,
        )  # fmt: skip


def _confirm(current: Experience, *, source: Any, session: Session | None) -> CreateResult:
    """The same value promoted again: confidence nudged up, a new source recorded ("unchanged")."""
    entry = provenance_entry(method=ExtractionMethod.PROMOTED, task=None, session=session, source=source)
    known = any(
        p.get("source") == source and p.get("session") == entry.get("session") for p in current.provenance
    )
    if not known:
        current.provenance = [*current.provenance, entry]
    current.confidence = boosted_confidence(current.confidence, 0.2)
    current.updated_at = timezone.now()
    current.save(update_fields=["provenance", "confidence", "updated_at"])
    return CreateResult(current, "unchanged")
