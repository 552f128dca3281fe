"""The user memory operations behind the API, the client, MCP and the CLI: read, correct, erase.

Writes go through `store` (memory_record / version_write), so a correction is a new version like any
new value: the old one keeps its text, gets `valid_to` and `superseded_by`, and `as_of` still shows
it. Events carry ids only, never a memory's text or subject.

Who may see a user: a user "exists" in a tenant when one of its sessions or memories names that
`user_id`; a key bound to an agent sees only the users of that agent's sessions, and of their
memories those agent_access.rows_visible lets it read (its agent's own, plus the others' the
tenant shares, read-only). Anything else answers NotFound, exactly like another tenant's user.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from memory.exceptions import Conflict, InvalidInput, NotFound
from memory.models import IdempotencyRecord, Session, Tenant, UserMemory, UserMemoryOrigin
from memory.services import recorder
from memory.services.agent_access import rows_changeable, rows_visible, user_memory_change_check
from memory.services.user_memory.store import (
    Recorded,
    memories_of,
    memory_history,
    memory_record,
    subject_lock,
    text_hash,
    validate,
    version_write,
)

HISTORY_LIMIT = 1000


class MemorySuperseded(Conflict, code="memory_superseded"):
    default_message = "This memory is no longer current: a newer version superseded it. Update that one."


@dataclass(frozen=True)
class UserScope:
    """Whose memories a caller reaches: the tenant, the user, and the agent its key is bound to."""

    tenant: Tenant
    user_id: str
    bound_agent: str = ""


def user_scope(*, tenant: Tenant, user_id: str, bound_agent: str = "") -> UserScope:
    """The scope of `user_id` for this caller, or NotFound (see the module doc). Read-only."""
    sessions = Session.objects.filter(tenant=tenant, user_id=user_id)
    if bound_agent:
        exists = bool(user_id) and sessions.filter(agent__external_id=bound_agent).exists()
    else:
        exists = bool(user_id) and (
            sessions.exists() or UserMemory.objects.filter(tenant=tenant, user_id=user_id).exists()
        )
    if not exists:
        raise NotFound.of("user", user_id)
    return UserScope(tenant=tenant, user_id=user_id, bound_agent=bound_agent)


def _visible(scope: UserScope) -> Q:
    """The memories this caller may read: a bound key's agent's own, plus the others' the tenant
    shares (agent_access.rows_visible)."""
    return rows_visible(tenant=scope.tenant, agent=scope.bound_agent, kind="user_memory")


def _scoped(scope: UserScope) -> QuerySet[UserMemory]:
    return (
        UserMemory.objects.filter(tenant=scope.tenant, user_id=scope.user_id)
        .filter(_visible(scope))
        .select_related("superseded_by")
    )


def user_memories_list(
    *, scope: UserScope, as_of: datetime | None = None, memory_type: str | None = None
) -> QuerySet[UserMemory]:
    """The user's current memories (or those current at `as_of`), optionally of one type. Read-only."""
    queryset = (
        memories_of(tenant=scope.tenant, user_id=scope.user_id, as_of=as_of)
        .filter(_visible(scope))
        .select_related("superseded_by")
    )
    return queryset.filter(memory_type=memory_type) if memory_type else queryset


def user_memory_get(*, scope: UserScope, memory_id: str) -> UserMemory:
    """One memory of the user, current or not; NotFound for any other id. Read-only."""
    memory = _scoped(scope).filter(public_id=memory_id).first()
    if memory is None:
        raise NotFound.of("memory", memory_id)
    return memory


def user_memory_history(*, scope: UserScope, memory_id: str) -> list[UserMemory]:
    """Every version of the memory's subject, oldest first (at most HISTORY_LIMIT). Read-only."""
    memory = user_memory_get(scope=scope, memory_id=memory_id)
    versions = memory_history(memory).filter(_visible(scope))
    return list(versions.select_related("superseded_by")[:HISTORY_LIMIT])


def user_memory_create(
    *, scope: UserScope, subject: str, text: str, memory_type: str, confidence: float
) -> Recorded:
    """Record a memory written by the caller (origin `api`): see store.memory_record. Atomic.

    A bound key may not supersede the subject's current value when another agent wrote it
    (AgentMismatch, 403): one value per subject, and the key changes only its own agent's.
    """
    with transaction.atomic():
        if scope.bound_agent:
            subject_lock(tenant=scope.tenant, user_id=scope.user_id, subject=subject.strip())
            owner = (
                UserMemory.objects.filter(
                    tenant=scope.tenant, user_id=scope.user_id, subject=subject.strip(), valid_to__isnull=True
                )
                .values_list("agent", flat=True)
                .first()
            )
            if owner is not None:
                user_memory_change_check(agent=scope.bound_agent, owner=owner)
        return memory_record(
            tenant=scope.tenant,
            user_id=scope.user_id,
            subject=subject,
            text=text,
            memory_type=memory_type,
            confidence=confidence,
            origin=UserMemoryOrigin.API,
            agent=scope.bound_agent,
        )


def user_memory_update(
    *,
    scope: UserScope,
    memory_id: str,
    text: str | None = None,
    memory_type: str | None = None,
    confidence: float | None = None,
) -> Recorded:
    """Correct a current memory: a NEW version of its subject with the changed fields. Atomic.

    Nothing changed → the memory itself, outcome `unchanged`. A memory that is no longer current →
    MemorySuperseded (409, `details.superseded_by`), also when a concurrent update superseded it
    first (the subject lock serialises them). Empty text → InvalidInput (422). A text change starts
    without sources (the caller's correction is not what those turns said); a change of type or
    confidence alone keeps them. The new version is embedded again.
    """
    if text is None and memory_type is None and confidence is None:
        raise InvalidInput(
            "Send at least one of text, type and confidence.",
            details={"fields": {"text": ["Nothing to change."]}},
        )
    memory = user_memory_get(scope=scope, memory_id=memory_id)
    user_memory_change_check(agent=scope.bound_agent, owner=memory.agent)
    new_text = memory.text if text is None else text
    new_type = memory.memory_type if memory_type is None else memory_type
    new_confidence = memory.confidence if confidence is None else confidence
    validate(
        user_id=scope.user_id,
        subject=memory.subject,
        text=new_text,
        memory_type=new_type,
        confidence=new_confidence,
    )
    with transaction.atomic():
        subject_lock(tenant=scope.tenant, user_id=scope.user_id, subject=memory.subject)
        memory = (
            UserMemory.objects.select_for_update(of=("self",))
            .select_related("superseded_by")
            .get(pk=memory.pk)
        )
        if memory.valid_to is not None:
            raise MemorySuperseded(
                details={"memory": memory.public_id, "superseded_by": _public(memory.superseded_by)}
            )
        text_changed = text_hash(new_text) != memory.text_hash
        if not text_changed and new_type == memory.memory_type and new_confidence == memory.confidence:
            return Recorded(memory=memory, outcome="unchanged")
        created = version_write(
            tenant=scope.tenant,
            current=memory,
            user_id=scope.user_id,
            subject=memory.subject,
            text=new_text,
            memory_type=new_type,
            sources=[] if text_changed else list(memory.sources),
            confidence=new_confidence,
            origin=UserMemoryOrigin.API,
            agent=scope.bound_agent or memory.agent,
            at=max(timezone.now(), memory.valid_from),
        )
    return Recorded(memory=created, outcome="superseded", superseded=memory)


def user_memory_delete(*, scope: UserScope, memory_id: str) -> list[str]:
    """Erase the memory and every earlier version of its subject; return the erased ids. Atomic.

    Later versions stay (they no longer point back at the erased ones). The stored answers of
    earlier idempotent writes of these memories go too, since they hold the text. One
    `user_memory.deleted` event with the ids and the count, no content. NotFound for an unknown id
    (so deleting twice answers 404 the second time).
    """
    memory = user_memory_get(scope=scope, memory_id=memory_id)
    user_memory_change_check(agent=scope.bound_agent, owner=memory.agent)
    with transaction.atomic():
        subject_lock(tenant=scope.tenant, user_id=scope.user_id, subject=memory.subject)
        erased = list(
            UserMemory.objects.select_for_update()
            .filter(
                tenant=scope.tenant,
                user_id=scope.user_id,
                subject=memory.subject,
                valid_from__lte=memory.valid_from,
            )
            .filter(rows_changeable(agent=scope.bound_agent))  # a bound key's own versions only
            .order_by("valid_from", "pk")
        )
        if memory.pk not in {m.pk for m in erased}:  # deleted meanwhile
            raise NotFound.of("memory", memory_id)
        ids = [m.public_id for m in erased]
        UserMemory.objects.filter(pk__in=[m.pk for m in erased]).delete()
        IdempotencyRecord.objects.filter(tenant=scope.tenant, response_body__id__in=ids).delete()
        recorder.event_append(
            tenant=scope.tenant,
            type="user_memory.deleted",
            payload={"memories": ids, "count": len(ids), "user_id": scope.user_id},
        )
    return ids


def _public(memory: UserMemory | None) -> str | None:
    return memory.public_id if memory is not None else None
