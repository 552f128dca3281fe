"""Reads of experience memory: one experience, the visible rows, the list. Read-only."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from memory.exceptions import NotFound
from memory.models import Experience, ExperienceScope, Tenant
from memory.services.agent_access import rows_visible


def experience_get(*, tenant: Tenant, experience_id: str, bound_agent: str | None = None) -> Experience:
    """One experience of `tenant` the caller may see. Read-only.

    Raises NotFound for a missing or foreign id, and for another agent's experience when
    `bound_agent` is set (404, not 403: a bound key must not learn which ids exist).
    """
    experience = (
        Experience.objects.filter(tenant=tenant, public_id=experience_id)
        .filter(rows_visible(tenant=tenant, agent=bound_agent or "", kind="experience"))
        .select_related("merged_into", "superseded_by", "source_task", "source_session")
        .first()
    )
    if experience is None:
        raise NotFound.of("experience", experience_id)
    return experience


def visible_filter(*, include_superseded: bool = False, as_of: datetime | None = None) -> Q:
    """Which rows a reader sees: active ones now, or those that were active at `as_of`."""
    if as_of is not None:
        condition = Q(created_at__lte=as_of) & (Q(merged_at__isnull=True) | Q(merged_at__gt=as_of))
        if not include_superseded:
            condition &= Q(superseded_at__isnull=True) | Q(superseded_at__gt=as_of)
        return condition
    condition = Q(merged_into__isnull=True)
    if not include_superseded:
        condition &= Q(superseded_by__isnull=True)
    return condition


def scope_filter(*, user_id: str | None) -> Q:
    """Tenant-wide experiences plus, when `user_id` is given, only that user's own ones."""
    if user_id is None:
        return Q()
    return Q(scope=ExperienceScope.TENANT) | Q(scope=ExperienceScope.USER, user_id=user_id)


def experiences_list(
    *,
    tenant: Tenant,
    user_id: str | None = None,
    kind: str | None = None,
    embedding_status: str | None = None,
    extraction_method: str | None = None,
    include_superseded: bool = False,
    as_of: datetime | None = None,
    agent: str | None = None,
    bound_agent: str | None = None,
) -> QuerySet[Experience]:
    """The tenant's visible experiences, filtered (`agent`: recorded by that agent). Read-only.

    `bound_agent`: the caller's key binding; only the rows it may read (agent_access.rows_visible)."""
    queryset = (
        Experience.objects.filter(tenant=tenant)
        .filter(visible_filter(include_superseded=include_superseded, as_of=as_of))
        .filter(rows_visible(tenant=tenant, agent=bound_agent or "", kind="experience"))
    )
    if user_id is not None:
        queryset = queryset.filter(scope_filter(user_id=user_id))
    if kind:
        queryset = queryset.filter(kind=kind)
    if embedding_status:
        queryset = queryset.filter(embedding_status=embedding_status)
    if extraction_method:
        queryset = queryset.filter(extraction_method=extraction_method)
    if agent:
        queryset = queryset.filter(agent=agent)
    return queryset.select_related("merged_into", "superseded_by", "source_task", "source_session")
