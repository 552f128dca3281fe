"""Deleting experiences: one by a caller, or the least recently used beyond the tenant's capacity."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Case, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from memory.exceptions import NotFound
from memory.models import Experience, ExperiencePolicy, Tenant
from memory.services import recorder
from memory.services.experiences.records import event_payload


@dataclass(frozen=True)
class DeleteResult:
    experience_id: str
    duplicates_deleted: list[str]
    restored: list[str]


def experience_delete(*, tenant: Tenant, experience: Experience) -> DeleteResult:
    """Delete one experience of `tenant` for good, with the hidden duplicates merged into it.

    Rows it superseded become visible again (their supersede link and time are cleared): the
    replacement is gone. Records `experience.deleted` with what went and what came back.
    Raises NotFound for another tenant's row.
    """
    if experience.tenant_id != tenant.pk:
        raise NotFound.of("experience", experience.public_id)
    with transaction.atomic():
        # The stream before the row: recorder.streams_lock's rule. (A row's source session does
        # not change; a deleted one leaves the tenant stream, locked below by the event.)
        session = experience.source_session
        recorder.stream_lock(tenant=tenant, session=session)
        locked = Experience.objects.select_for_update().filter(tenant=tenant, pk=experience.pk).first()
        if locked is None:  # deleted meanwhile
            raise NotFound.of("experience", experience.public_id)
        duplicates = list(
            Experience.objects.filter(tenant=tenant, merged_into=locked).values_list("public_id", flat=True)
        )
        restored = list(
            Experience.objects.filter(tenant=tenant, superseded_by=locked).values_list("public_id", flat=True)
        )
        Experience.objects.filter(tenant=tenant, superseded_by=locked).update(
            superseded_by=None, superseded_at=None, updated_at=timezone.now()
        )
        Experience.objects.filter(tenant=tenant, merged_into=locked).delete()
        payload = event_payload(
            locked, duplicates_deleted=duplicates[:100], restored=restored[:100], problem=locked.problem[:200]
        )
        session = locked.source_session
        locked.delete()
        recorder.event_append(tenant=tenant, type="experience.deleted", session=session, payload=payload)
    return DeleteResult(experience.public_id, duplicates, restored)


def experiences_evict(*, tenant: Tenant) -> int:
    """Delete the tenant's experiences beyond policy.capacity, least recently USED first.

    Hidden rows (merged, superseded) go before visible ones; among equals, the oldest last use
    (or creation, if never used) goes first. Records one `retention.evicted` event. Idempotent.
    """
    capacity = ExperiencePolicy.for_tenant(tenant).capacity
    with transaction.atomic():
        # One evictor per tenant at a time: the policy row is the lock.
        ExperiencePolicy.objects.select_for_update().filter(tenant=tenant).first()
        excess = Experience.objects.filter(tenant=tenant).count() - capacity
        if excess <= 0:
            return 0
        victims = list(
            Experience.objects.filter(tenant=tenant)
            .annotate(
                last_use=Coalesce("last_used_at", "created_at"),
                visible=Case(
                    When(Q(merged_into__isnull=False) | Q(superseded_by__isnull=False), then=Value(0)),
                    default=Value(1),
                ),
            )
            .order_by("visible", "last_use", "pk")
            .values_list("pk", "public_id")[:excess]
        )
        ids = [pk for pk, _ in victims]
        # Rows merged into a victim go with it, so no hidden duplicate resurfaces.
        Experience.objects.filter(merged_into_id__in=ids).delete()
        Experience.objects.filter(pk__in=ids).delete()
        recorder.event_append(
            tenant=tenant,
            type="retention.evicted",
            payload={
                "kind": "experience",
                "count": len(ids),
                "capacity": capacity,
                "experiences": [public_id for _, public_id in victims[:100]],
            },
        )
    return len(ids)


def experiences_evict_all() -> int:
    """Run eviction for every tenant over capacity. Returns experiences evicted."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.tenant_id FROM {Experience._meta.db_table} e "
            f"LEFT JOIN {ExperiencePolicy._meta.db_table} p ON p.tenant_id = e.tenant_id "
            "GROUP BY e.tenant_id, p.capacity HAVING count(*) > COALESCE(p.capacity, %s)",
            [ExperiencePolicy._meta.get_field("capacity").default],
        )
        tenant_ids = [row[0] for row in cursor.fetchall()]
    return sum(experiences_evict(tenant=tenant) for tenant in Tenant.objects.filter(pk__in=tenant_ids))
