"""Job intents: the transactional outbox of background jobs (see memory/services/jobs.py)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from memory.models.tenancy import Tenant

__all__ = ["JobIntent", "JobStatus"]


class JobStatus(models.TextChoices):
    PENDING = "pending"  # written with the data it refers to; not taken by a worker yet
    RUNNING = "running"  # taken; the runner holds the row lock until it finishes
    DONE = "done"
    FAILED = "failed"


class JobIntent(models.Model):
    """One background job a committed write implies. Written in the writer's transaction.

    Unique on (kind, key) among pending intents: asking twice for a job nobody has taken yet
    coalesces into one. A running intent does not block a new one (the running job may have read
    its input before the new write).
    """

    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=64)
    key = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    run_after = models.DateTimeField(null=True, blank=True)
    taken_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    merged_into = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "key"], condition=Q(status="pending"), name="jobintent_pending_unique"
            ),
        ]
        indexes = [
            models.Index(
                fields=["status", "dispatched_at"],
                condition=Q(status__in=["pending", "running"]),
                name="jobintent_open_idx",
            ),
            models.Index(fields=["tenant", "status", "-finished_at"], name="jobintent_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.key} ({self.status})"
