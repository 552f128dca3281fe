"""Tenants, their API keys and dashboard members, and stored idempotent responses."""

from __future__ import annotations

import hashlib
import secrets
from typing import ClassVar, Self

from django.conf import settings
from django.db import models
from django.utils import timezone

from memory.models import policy_cache

KEY_PREFIX = "ctx_"


class Tenant(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    is_active = models.BooleanField(default=True, help_text="An inactive tenant's keys are refused.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering: ClassVar = ["name"]

    def __str__(self) -> str:
        return self.name


class TenantPolicyBase(models.Model):
    """Base of the per-tenant policy models: one row per tenant, created on first use.

    Each capability owns its policy model (retention, context budgets, decay thresholds, …);
    the admin shows them all inline on the tenant page.
    """

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="+")

    class Meta:
        abstract = True

    @classmethod
    def for_tenant(cls, tenant: Tenant) -> Self:
        """The tenant's row (created with the defaults on first use), read once per process while
        the tenant's configuration version holds (memory/models/policy_cache.py). Shared by the
        process: change it through its service or `save()`, never by setting attributes alone."""
        return policy_cache.policy_get(cls, tenant)


class ApiKeyScope(models.TextChoices):
    READ = "read", "read"
    WRITE = "write", "write"
    ADMIN = "admin", "admin"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKey(models.Model):
    """A bearer key. The secret is shown once; only its SHA-256 and a visible prefix are kept.

    A key is `ctx_` + 8 visible characters + `_` + 32 secret characters. SHA-256 (not a slow
    password hash) is right here: the secret is 190 random bits, so there is nothing to brute-force,
    and every API call must verify it quickly.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(
        default=list, help_text='Any of "read", "write", "admin". Empty = read and write.'
    )
    agent_external_id = models.CharField(
        "bound to agent",
        max_length=200,
        blank=True,
        default="",
        help_text="Empty: the key may act as any agent of the tenant (named by X-Agent-Id). Set: it always "
        "acts as this agent, so another agent's private context and inbox are out of its reach.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering: ClassVar = ["-created_at"]
        verbose_name = "API key"
        verbose_name_plural = "API keys"

    def __str__(self) -> str:
        return f"{self.name} ({KEY_PREFIX}{self.prefix}…)"

    @staticmethod
    def generate() -> tuple[str, str, str]:
        """Return (full key, visible prefix, hash of the full key)."""
        prefix = secrets.token_hex(4)
        full = f"{KEY_PREFIX}{prefix}_{secrets.token_urlsafe(24)}"
        return full, prefix, hash_secret(full)

    @property
    def effective_scopes(self) -> set[str]:
        return set(self.scopes) if self.scopes else {ApiKeyScope.READ, ApiKeyScope.WRITE}

    @property
    def is_usable(self) -> bool:
        now = timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class MembershipRole(models.TextChoices):
    VIEWER = "viewer", "viewer"
    OPERATOR = "operator", "operator"
    ADMIN = "admin", "admin"


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=MembershipRole.choices, default=MembershipRole.VIEWER)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_user_tenant_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class IdempotencyRecord(models.Model):
    """The stored response of a write made with an Idempotency-Key header.

    Written in the same transaction as the write it describes, so a retry either finds it
    (and gets the original response) or finds nothing (and the write did not happen).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField(null=True)
    response_body = models.JSONField(null=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "key"], name="idempotency_tenant_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status_code or 'in progress'})"


class SharingPolicy(TenantPolicyBase):
    """Which kinds of one agent's text a context build of another agent of the tenant may read.

    Default: none. An agent's prompt then carries only what its own sessions, its own key and the
    session's user wrote through it, so a writer with one agent's key cannot steer another agent
    (docs/reliability.md, "Cross-agent memory"). memory/services/sharing.py applies it.
    """

    share_digests = models.BooleanField(
        default=False,
        help_text="A build may be offered (and recall) the digests of the user's sessions with other agents.",
    )
    share_messages = models.BooleanField(
        default=False,
        help_text="Recall may bring back messages, summaries and tracked facts of the user's sessions "
        "with other agents.",
    )
    share_experiences = models.BooleanField(
        default=False,
        help_text="Tenant-wide experiences recorded by other agents (or by a key bound to none) "
        "enter builds.",
    )
    share_user_memories = models.BooleanField(
        default=False,
        help_text="The session user's own memories recorded by other agents (or by a key bound to none) "
        "enter builds.",
    )

    class Meta:
        verbose_name = "sharing policy"
        verbose_name_plural = "sharing policy"

    def __str__(self) -> str:
        return f"sharing policy of {self.tenant_id}"
