"""Recording a user memory and reading a user's memories: the one write path of UserMemory.

A new value for a subject that already has a current memory supersedes it: the old row gets
`valid_to` and `superseded_by`, the new one starts at the same moment. Repeating the current value
(same text, ignoring case and spacing) only adds its sources. Every change is one event on the
tenant stream, with ids and the subject only: memory text never goes into the event log, so
forgetting a user has no event content to chase.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from memory.exceptions import Conflict, InvalidInput
from memory.models import Tenant, UserMemory, UserMemoryOrigin, UserMemoryType
from memory.services import recorder
from memory.services.user_memory.embed import embedding_enqueue

MAX_TEXT_CHARS = 4000
MAX_SUBJECT_CHARS = 200
_LOCK_NAMESPACE = 0x756D656D  # "umem": pg_advisory_xact_lock(namespace, hash of tenant, user, subject)


@dataclass(frozen=True)
class Recorded:
    memory: UserMemory
    outcome: str  # "created" | "superseded" | "unchanged"
    superseded: UserMemory | None = None


def normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def text_hash(text: str) -> str:
    return hashlib.sha256(normalized(text).encode()).hexdigest()


def validate(*, user_id: str, subject: str, text: str, memory_type: str, confidence: float) -> None:
    errors: dict[str, list[str]] = {}
    if not user_id.strip():
        errors["user_id"] = ["A user memory needs a user id."]
    if not subject.strip() or len(subject) > MAX_SUBJECT_CHARS:
        errors["subject"] = [f"A subject is 1 to {MAX_SUBJECT_CHARS} characters."]
    if not text.strip():
        errors["text"] = ["A memory needs text."]
    elif len(text) > MAX_TEXT_CHARS:
        errors["text"] = [f"At most {MAX_TEXT_CHARS} characters."]
    if memory_type not in UserMemoryType.values:
        errors["type"] = [f"One of {', '.join(UserMemoryType.values)}."]
    if not 0.0 <= confidence <= 1.0:
        errors["confidence"] = ["Between 0 and 1."]
    if errors:
        raise InvalidInput(details={"fields": errors})


def subject_lock(*, tenant: Tenant, user_id: str, subject: str) -> None:
    """Serialise writers of one subject until the transaction ends (two extractions racing).

    The tenant's event stream, where user memories' events go, is taken first
    (recorder.streams_lock's rule): an extraction records several subjects in one transaction,
    holding the stream from its first event on, and a writer that held a later subject while
    waiting for the stream deadlocked with it."""
    recorder.stream_lock(tenant=tenant)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
            [_LOCK_NAMESPACE, f"{tenant.pk}\x1f{user_id}\x1f{subject}"],
        )


def _merge_sources(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen = {(s.get("session"), s.get("seq")) for s in old}
    merged = list(old)
    for source in new:
        if (source.get("session"), source.get("seq")) not in seen:
            merged.append(source)
            seen.add((source.get("session"), source.get("seq")))
    return merged


def memory_record(
    *,
    tenant: Tenant,
    user_id: str,
    subject: str,
    text: str,
    memory_type: str = UserMemoryType.FACT,
    sources: list[dict[str, Any]] | None = None,
    confidence: float = 1.0,
    origin: str = UserMemoryOrigin.API,
    agent: str = "",
    at: datetime | None = None,
) -> Recorded:
    """Record the current value of `subject` for the user (see the module doc). Atomic.

    A new version queues its embedding (memory.services.user_memory.embed) in the same transaction.
    """
    subject = subject.strip()
    validate(user_id=user_id, subject=subject, text=text, memory_type=memory_type, confidence=confidence)
    at = at or timezone.now()
    sources = list(sources or [])
    with transaction.atomic():
        subject_lock(tenant=tenant, user_id=user_id, subject=subject)
        current = (
            UserMemory.objects.select_for_update()
            .filter(tenant=tenant, user_id=user_id, subject=subject, valid_to__isnull=True)
            .first()
        )
        if current is not None and current.text_hash == text_hash(text):
            current.sources = _merge_sources(current.sources, sources)
            current.confidence = max(current.confidence, confidence)
            current.updated_at = timezone.now()
            current.save(update_fields=["sources", "confidence", "updated_at"])
            return Recorded(memory=current, outcome="unchanged")
        if current is not None and current.valid_from > at:
            # An older statement arriving late (a batch extracted out of order) must not replace
            # a newer value.
            raise Conflict(
                f"Subject {subject!r} already has a value from {current.valid_from.isoformat()}.",
                details={"memory": current.public_id},
            )
        memory = version_write(
            tenant=tenant,
            current=current,
            user_id=user_id,
            subject=subject,
            text=text,
            memory_type=memory_type,
            sources=sources,
            confidence=confidence,
            origin=origin,
            agent=agent,
            at=at,
        )
    return Recorded(memory=memory, outcome="superseded" if current else "created", superseded=current)


def version_write(
    *,
    tenant: Tenant,
    current: UserMemory | None,
    user_id: str,
    subject: str,
    text: str,
    memory_type: str,
    sources: list[dict[str, Any]],
    confidence: float,
    origin: str,
    agent: str,
    at: datetime,
) -> UserMemory:
    """Write a new version of `subject` (superseding `current`, locked by the caller), its events and
    its embedding job. Inside the caller's transaction, under its `subject_lock`."""
    memory = UserMemory(
        tenant=tenant,
        user_id=user_id,
        subject=subject,
        memory_type=memory_type,
        text=text.strip(),
        sources=sources,
        confidence=confidence,
        origin=origin,
        agent=agent,
        valid_from=at,
        text_hash=text_hash(text),
    )
    if current is not None:
        current.valid_to = at
        current.updated_at = timezone.now()
        current.save(update_fields=["valid_to", "updated_at"])
    memory.save()
    entries: list[tuple[str, dict[str, Any]]] = [
        ("user_memory.recorded", {"memory": memory.public_id, "user_id": user_id, "origin": origin})
    ]
    if current is not None:
        current.superseded_by = memory
        current.save(update_fields=["superseded_by"])
        entries.append(
            (
                "user_memory.superseded",
                {"memory": current.public_id, "superseded_by": memory.public_id, "user_id": user_id},
            )
        )
    recorder.events_append(tenant=tenant, entries=entries)
    embedding_enqueue(tenant=tenant)
    return memory


def memories_of(*, tenant: Tenant, user_id: str, as_of: datetime | None = None) -> QuerySet[UserMemory]:
    """The user's memories that were current at `as_of` (now when None), oldest subject first."""
    queryset = UserMemory.objects.filter(tenant=tenant, user_id=user_id)
    if as_of is None:
        queryset = queryset.filter(valid_to__isnull=True)
    else:
        queryset = queryset.filter(valid_from__lte=as_of).filter(
            Q(valid_to__isnull=True) | Q(valid_to__gt=as_of)
        )
    return queryset.order_by("subject", "valid_from")


def memory_history(memory: UserMemory) -> QuerySet[UserMemory]:
    """Every version of the memory's subject for its user, oldest first."""
    return UserMemory.objects.filter(
        tenant_id=memory.tenant_id, user_id=memory.user_id, subject=memory.subject
    ).order_by("valid_from", "id")
