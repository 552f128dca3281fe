"""How far extraction of user memories has read each session (memory/services/user_memory/extraction.py).

One row per session: the seq of the last turn read. It holds no content, so forgetting a user
leaves nothing here to erase; it goes with its session.
"""

from __future__ import annotations

from django.db import models

from memory.models.sessions import Session
from memory.models.tenancy import Tenant

__all__ = ["UserMemoryExtraction"]


class UserMemoryExtraction(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="+")
    covers_up_to_seq = models.PositiveBigIntegerField(default=0)
    method = models.CharField(max_length=16, blank=True, default="")  # offline | model | model_fallback
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"extraction of session {self.session_id} up to {self.covers_up_to_seq}"
