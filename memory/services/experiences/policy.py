"""The tenant's experience policy as the API reads and changes it."""

from __future__ import annotations

from typing import Any

from memory.models import ExperiencePolicy, Tenant
from memory.services.tenancy import tenant_policy_update

# The per-tenant experience policy fields a caller may read and change through the API.
POLICY_FIELDS = (
    "capacity",
    "merge_threshold",
    "merge_token_overlap",
    "supersede_problem_threshold",
    "solution_agreement_threshold",
    "vector_weight",
    "text_weight",
    "context_min_similarity",
    "helpful_weight",
)


def experience_policy_get(*, tenant: Tenant) -> ExperiencePolicy:
    """The tenant's experience policy (created with the defaults on first use)."""
    return ExperiencePolicy.for_tenant(tenant)


def experience_policy_update(
    *, tenant: Tenant, changes: dict[str, Any], actor: str = "api"
) -> ExperiencePolicy:
    """Change some of the tenant's experience policy fields (POLICY_FIELDS); the rest keep their value.

    Records `policy.updated` with the old and new values. A lower capacity is enforced by the
    eviction beat job (every 10 minutes). Raises InvalidInput for an unknown field.
    """
    return tenant_policy_update(
        model=ExperiencePolicy,
        tenant=tenant,
        changes=changes,
        fields=POLICY_FIELDS,
        name="experiences",
        actor=actor,
    )
