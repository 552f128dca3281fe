"""Items of the key-value store (LangGraph's BaseStore over HTTP: ctxapp/integrations/langgraph_store.py)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone

from memory.models.tenancy import Tenant

__all__ = ["StoreItem"]


class StoreItem(models.Model):
    """One value under (namespace, key). `owner` is the agent a bound API key acts as ("" for the
    tenant's unbound keys): each owner has a store of its own. `texts` are what search embeds."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    owner = models.CharField(max_length=200, blank=True, default="")
    namespace = models.JSONField(default=list)
    namespace_path = models.CharField(max_length=1000)
    key = models.CharField(max_length=1000)
    value = models.JSONField(default=dict)
    texts = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    ttl_minutes = models.FloatField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["tenant", "owner", "namespace_path", "key"], name="store_item_unique"
            )
        ]
        indexes: ClassVar = [
            models.Index(fields=["tenant", "owner", "namespace_path"], name="store_item_namespace"),
            # The retention sweep's "past their TTL" across tenants.
            models.Index(
                fields=["expires_at"], condition=models.Q(expires_at__isnull=False), name="store_item_expiry"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_path}/{self.key}"
