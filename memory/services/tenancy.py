"""Tenants and API keys."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from memory.models import ApiKey, ApiKeyScope, Membership, MembershipRole, Tenant

DEMO_TENANT_SLUG = "demo"
DEMO_ADMIN_USERNAME = "admin"


def api_key_create(
    *, tenant: Tenant, name: str, scopes: list[str] | None = None, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is not stored and cannot be shown again."""
    unknown = set(scopes or []) - set(ApiKeyScope.values)
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(sorted(unknown))}")
    full, prefix, digest = ApiKey.generate()
    key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, secret_hash=digest, scopes=list(scopes or []), expires_at=expires_at
    )
    return key, full


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke a key (idempotent): every later request with it answers 401."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


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
