"""Memory search: a tenant's word statistics, snapshotted for searches over the whole tenant.

A search whose scope is a whole tenant of more than SCOPE_CORPUS_MAX messages needs the document
frequency of each query word (how many of the tenant's messages hold it). Counting them at query
time costs a heap visit per matching row; a snapshot holds them all, taken in one statement
(memory/services/memory_search/term_stats.py).
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from memory.models.tenancy import Tenant

__all__ = ["SearchTermSnapshot", "SearchTermStat"]


class SearchTermSnapshot(models.Model):
    """When a tenant's word statistics were taken, and over how many messages."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="search_term_snapshot")
    messages = models.PositiveBigIntegerField(help_text="The tenant's messages when the snapshot was taken.")
    avg_len = models.FloatField(help_text="Their mean lexeme count (length of the tsvector).")
    taken_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.tenant_id}: {self.messages} messages at {self.taken_at:%Y-%m-%d %H:%M}"


class SearchTermStat(models.Model):
    """Messages of the tenant whose search_vector holds `lexeme`, as of the tenant's snapshot."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    lexeme = models.TextField()
    rows = models.PositiveBigIntegerField()

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "lexeme"], name="search_term_stat_unique")
        ]

    def __str__(self) -> str:
        return f"{self.lexeme}: {self.rows}"
