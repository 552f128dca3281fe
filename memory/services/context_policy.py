"""The context policy: the tenant's defaults, layered with the session's and a request's overrides.

Tenant ContextPolicy ← session metadata `context_policy` (set at create) ← SessionContextPolicy ←
the request's `budget` overrides. `context_policy_effective` is what a build uses;
`context_policy_read` is the same layering for views that only look (it never writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.utils import timezone

from memory.exceptions import InvalidInput
from memory.models import ContextPolicy, Session, SessionContextPolicy, Tenant
from memory.services import recorder

# The tenant policy's fields a session or a request may override; their types and bounds are the
# model's (ContextPolicy's field validators), so the two cannot drift.
OVERRIDABLE = (
    "history_window",
    "summarise_threshold",
    "keep_verbatim",
    "output_reserve",
    "char_gate",
    "memory_limit",
    "memory_max_chars",
    "near_limit",
    "middle_start",
    "middle_end",
    "mode",
    "summary_max_tokens",
    "user_profile_share",
    "user_profile_max_tokens",
)
FIELD_KINDS: dict[type[models.Field], type] = {
    models.PositiveIntegerField: int,
    models.FloatField: float,
    models.CharField: str,
}


def _field_spec(name: str) -> tuple[type, float | None, float | None]:
    """(type, minimum, maximum) of a ContextPolicy field: the tightest of its value validators
    (those it declares and, for integers, the database column's range)."""
    field = ContextPolicy._meta.get_field(name)
    assert isinstance(field, models.Field)  # a column, not a relation
    kind = FIELD_KINDS[type(field)]
    if kind is str:
        return kind, None, None
    lows = [v.limit_value for v in field.validators if isinstance(v, MinValueValidator)]
    highs = [v.limit_value for v in field.validators if isinstance(v, MaxValueValidator)]
    return kind, max(lows, default=None), min(highs, default=None)


# name → (type, minimum, maximum): the keys a session or a request may override
POLICY_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    **{name: _field_spec(name) for name in OVERRIDABLE},
    "max_input_tokens": (int, 256, 100_000_000),  # caps the model's input limit (override only)
}


@dataclass(frozen=True)
class EffectivePolicy:
    history_window: int
    summarise_threshold: float
    keep_verbatim: int
    output_reserve: int
    char_gate: int
    memory_limit: int
    memory_max_chars: int
    near_limit: float
    middle_start: float
    middle_end: float
    mode: str
    summary_max_tokens: int
    user_profile_share: float
    user_profile_max_tokens: int
    max_input_tokens: int | None
    mode_parts: dict[str, Any]
    default_model: str


def policy_overrides_validate(overrides: Any, *, field_name: str = "budget") -> dict[str, Any]:
    """Check override keys, types and bounds (POLICY_FIELDS). Raises InvalidInput naming the field
    (`budget.history_window`). The API's input serializers call it at the edge; the service checks
    only what it reads back from storage (a session's `metadata.context_policy`)."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise InvalidInput(details={"fields": {field_name: ["Expected an object."]}})
    clean: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in POLICY_FIELDS:
            raise InvalidInput(
                f"Unknown policy key {key!r}; known: {', '.join(sorted(POLICY_FIELDS))}.",
                details={"fields": {f"{field_name}.{key}": ["Unknown key."]}},
            )
        kind, low, high = POLICY_FIELDS[key]
        ok = (
            isinstance(value, str)
            if kind is str
            else (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and (kind is float or float(value).is_integer())
            )
        )
        if not ok:
            raise InvalidInput(details={"fields": {f"{field_name}.{key}": [f"Expected {kind.__name__}."]}})
        if kind is not str:
            value = kind(value)
            if (low is not None and value < low) or (high is not None and value > high):
                raise InvalidInput(
                    details={"fields": {f"{field_name}.{key}": [f"Must be between {low} and {high}."]}}
                )
        clean[key] = value
    return clean


def _layered(*, base: ContextPolicy, session: Session, overrides: dict[str, Any] | None) -> dict[str, Any]:
    values: dict[str, Any] = {key: getattr(base, key) for key in POLICY_FIELDS if key != "max_input_tokens"}
    values["max_input_tokens"] = None
    layers = [
        policy_overrides_validate(
            (session.metadata or {}).get("context_policy"), field_name="metadata.context_policy"
        ),
    ]
    stored = SessionContextPolicy.objects.filter(session=session).values_list("overrides", flat=True).first()
    layers.append(stored or {})
    layers.append(overrides or {})
    for layer in layers:
        values.update(layer)
    return values


def context_policy_effective(
    *, tenant: Tenant, session: Session, overrides: dict[str, Any] | None = None
) -> EffectivePolicy:
    """Tenant policy ← session metadata `context_policy` (set at create) ← SessionContextPolicy ←
    this request's overrides. Read-only (creates the tenant's policy row on first use)."""
    base = ContextPolicy.for_tenant(tenant)
    values = _layered(base=base, session=session, overrides=overrides)
    mode_parts = base.mode_parts or {}
    if values["mode"] not in mode_parts:
        raise InvalidInput(
            f"Unknown mode {values['mode']!r}; this tenant's modes: {', '.join(sorted(mode_parts))}.",
            details={"fields": {"mode": ["Unknown mode."]}},
        )
    if values["middle_start"] > values["middle_end"]:
        raise InvalidInput(details={"fields": {"budget.middle_start": ["Must not exceed middle_end."]}})
    return EffectivePolicy(**values, mode_parts=mode_parts, default_model=base.default_model)


def context_policy_read(*, tenant: Tenant, session: Session) -> EffectivePolicy:
    """The policy the session's next build would use, for views that only look: the same layers
    as `context_policy_effective` without a request's overrides. Never writes (a tenant without a
    policy row reads the model defaults) and does not check the mode. Raises InvalidInput only for
    a session whose stored overrides are malformed."""
    base = ContextPolicy.objects.filter(tenant=tenant).first() or ContextPolicy(tenant=tenant)
    values = _layered(base=base, session=session, overrides=None)
    return EffectivePolicy(**values, mode_parts=base.mode_parts or {}, default_model=base.default_model)


def session_context_policy_set(
    *, tenant: Tenant, session: Session, overrides: dict[str, Any]
) -> SessionContextPolicy:
    """Replace the session's policy overrides, validated by the caller (policy_overrides_validate).
    Records `context.policy_changed`. Idempotent. Raises InvalidInput when the overrides and the
    tenant's policy together are not a valid policy (an unknown mode)."""
    clean = dict(overrides)
    with transaction.atomic():
        row, _ = SessionContextPolicy.objects.update_or_create(
            session=session, defaults={"tenant": tenant, "overrides": clean, "updated_at": timezone.now()}
        )
        context_policy_effective(
            tenant=tenant, session=session
        )  # e.g. an unknown mode fails here, rolled back
        recorder.event_append(
            tenant=tenant, type="context.policy_changed", session=session, payload={"overrides": clean}
        )
    return row
