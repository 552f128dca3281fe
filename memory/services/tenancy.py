"""Tenants and API keys."""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from memory.exceptions import InvalidInput, NotFound
from memory.models import (
    ApiKey,
    ApiKeyScope,
    Membership,
    MembershipRole,
    Tenant,
    TenantPolicyBase,
)
from memory.services import recorder

logger = logging.getLogger(__name__)

DEMO_TENANT_SLUG = "demo"
DEMO_ADMIN_USERNAME = "admin"


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    expires_at: datetime | None = None,
    agent_external_id: str = "",
    actor: str | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is not stored and cannot be shown again.

    Not idempotent (each call makes a new key). With `actor` (who asked: "api-key ctx_ab12cd34",
    "admin user alice"), records an `api_key.created` event on the tenant stream in the same
    transaction. With `agent_external_id` the key is bound to that agent (it always acts as it).
    Raises ValueError for an unknown scope.
    """
    unknown = set(scopes or []) - set(ApiKeyScope.values)
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(sorted(unknown))}")
    full, prefix, digest = ApiKey.generate()
    with transaction.atomic():
        key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            secret_hash=digest,
            scopes=sorted(set(scopes or [])),
            expires_at=expires_at,
            agent_external_id=agent_external_id,
        )
        if actor is not None:
            _record(tenant=tenant, type="api_key.created", api_key=key, actor=actor)
    return key, full


def api_key_revoke(*, api_key: ApiKey, actor: str | None = None) -> ApiKey:
    """Revoke a key: every later request with it answers 401.

    Idempotent: revoking a revoked key changes nothing and records nothing. With `actor`, the
    first revocation records an `api_key.revoked` event on the tenant stream.
    """
    with transaction.atomic():
        # Conditional update: two concurrent revocations record one event, not two.
        changed = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        api_key.refresh_from_db(fields=["revoked_at"])
        if changed:
            api_keys_changed()
        if changed and actor is not None:
            _record(tenant=api_key.tenant, type="api_key.revoked", api_key=api_key, actor=actor)
    return api_key


# --- the API-key cache's generation ------------------------------------------------------------
# Web processes cache API-key lookups for CTXAPP_API_KEY_CACHE_SECONDS (memory/api/auth.py). A
# revocation, an expiry change or a tenant being disabled must be honoured at once, by every
# process on the host: each change writes a new generation to a small file in the data
# directory, and a cached lookup is used only while the file still holds the generation it was
# read under (one small file read per request instead of a database round trip).


def _generation_path() -> str:
    return str(settings.DATA_DIR / "api-key-generation")


def api_keys_generation() -> str:
    """The current generation of API keys and tenants (changes whenever one may have been revoked)."""
    try:
        with open(_generation_path()) as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


def api_keys_changed(**_: Any) -> None:
    """Start a new generation: every process drops its cached API-key lookups before the next request.

    Called when a key is revoked or saved, and when a tenant is saved (signals in memory.apps).
    Inside a transaction it starts one now and another after the commit: a process that re-read
    the key before the commit (and cached the old row) drops it then.
    """
    _generation_write()
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(_generation_write)


def _generation_write() -> None:
    # Atomically (temp file + rename): a reader sees the old or the new generation, never half.
    path = _generation_path()
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".api-key-generation-")
        with os.fdopen(fd, "w") as handle:
            handle.write(f"{time.time_ns()}-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(temporary, path)
    except OSError:
        # A read-only data directory must not fail the revocation itself: caches then expire
        # within CTXAPP_API_KEY_CACHE_SECONDS instead of at once.
        logger.warning("could not write %s; cached API keys expire within their TTL", path, exc_info=True)


def api_key_get(*, tenant: Tenant, prefix: str) -> ApiKey:
    """The tenant's key with this visible prefix. Read-only; raises NotFound for another tenant's key."""
    key = ApiKey.objects.filter(tenant=tenant, prefix=prefix).first()
    if key is None:
        raise NotFound.of("api key", prefix)
    return key


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    """The tenant's keys, revoked and expired ones included. Read-only."""
    return ApiKey.objects.filter(tenant=tenant)


def _record(*, tenant: Tenant, type: str, api_key: ApiKey, actor: str) -> None:
    recorder.event_append(
        tenant=tenant,
        type=type,
        payload={
            "key_prefix": api_key.prefix,
            "name": api_key.name,
            "scopes": api_key.scopes,
            "actor": actor,
        },
    )


@dataclass(frozen=True)
class FirstRun:
    username: str
    password: str
    api_key: str


@transaction.atomic
def bootstrap_demo() -> FirstRun | None:
    """On an empty installation, create the demo tenant, an admin login and an API key.

    Returns what to print once, or None when the installation already has a tenant.
    """
    if Tenant.objects.exists():
        return None
    tenant = Tenant.objects.create(name="Demo", slug=DEMO_TENANT_SLUG)
    password = secrets.token_urlsafe(12)
    user_model = get_user_model()
    user = user_model.objects.filter(username=DEMO_ADMIN_USERNAME).first()
    if user is None:
        user = user_model.objects.create_superuser(DEMO_ADMIN_USERNAME, email="", password=password)
    else:
        user.set_password(password)
        user.save(update_fields=["password"])
    Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": MembershipRole.ADMIN})
    _, secret = api_key_create(tenant=tenant, name="demo key (first run)")
    return FirstRun(username=DEMO_ADMIN_USERNAME, password=password, api_key=secret)


def tenant_policy_update(
    *,
    model: type[TenantPolicyBase],
    tenant: Tenant,
    changes: dict[str, Any],
    fields: tuple[str, ...],
    name: str,
    actor: str = "api",
) -> Any:
    """Change some `fields` of the tenant's row of a policy `model`; the rest keep their value.

    The one write path of the per-tenant policies the API changes: raises InvalidInput for a
    field outside `fields` (nothing written), saves under a row lock and records
    `policy.updated` (`name`, actor, old and new values) in the same transaction.
    """
    unknown = sorted(set(changes) - set(fields))
    if unknown:
        raise InvalidInput(
            f"Unknown policy field(s): {', '.join(unknown)}.",
            details={"fields": {field: ["Unknown field."] for field in unknown}},
        )
    with transaction.atomic():
        model.for_tenant(tenant)
        policy = model._default_manager.select_for_update().get(tenant=tenant)
        before = {field: getattr(policy, field) for field in changes}
        for field, value in changes.items():
            setattr(policy, field, value)
        if changes:
            policy.save(update_fields=list(changes))
            recorder.event_append(
                tenant=tenant,
                type="policy.updated",
                payload={"policy": name, "actor": actor, "before": before, "after": dict(changes)},
            )
    return policy
