"""What a process-local cache of a tenant's content checks to know it is still true."""

from __future__ import annotations

from django.db import models

from memory.models.tenancy import Tenant

__all__ = ["ContentGeneration"]


class ContentGeneration(models.Model):
    """A tenant's content generation: bumped, in the same transaction, by every change of existing
    content that counts and ids do not show (a redaction, an erasure, a re-embedding with the same
    model). Each process's search corpus reads it with its version, so no process serves text a
    committed redaction or erasure removed (memory/services/forget.py)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="+")
    generation = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"content generation {self.generation} of {self.tenant_id}"
