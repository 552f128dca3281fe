"""Agents, their sessions and messages, and tasks (execution records)."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone

from memory.ids import new_sess_id, new_task_id
from memory.models.tenancy import Tenant, TenantPolicyBase

__all__ = [
    "Agent",
    "Message",
    "MessageRole",
    "Session",
    "SessionRetentionPolicy",
    "SessionStatus",
    "Task",
    "TaskStatus",
    "ValueTier",
]


class Agent(models.Model):
    """An agent, known by the external id its caller chose (unique per tenant)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agents")
    external_id = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "external_id"], name="agent_tenant_external_unique")
        ]

    def __str__(self) -> str:
        return self.external_id


class SessionStatus(models.TextChoices):
    OPEN = "open"
    ENDED = "ended"
    EXPIRED = "expired"
    EVICTED = "evicted"


class Session(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sessions")
    public_id = models.CharField(max_length=32, unique=True, default=new_sess_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sessions")
    user_id = models.CharField(max_length=200, blank=True, default="")
    model_name = models.CharField(max_length=200, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=SessionStatus.choices, default=SessionStatus.OPEN)
    created_at = models.DateTimeField(default=timezone.now)
    last_accessed_at = models.DateTimeField(default=timezone.now)
    # Idle TTL of this session (from the tenant's SessionRetentionPolicy at creation unless the
    # caller chose one): every access moves expires_at to last_accessed_at + this.
    idle_ttl_seconds = models.PositiveIntegerField(default=24 * 3600)
    expires_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The last message seq handed out; incremented under the row lock, so seqs are gapless.
    message_seq = models.PositiveBigIntegerField(default=0)
    message_count = models.PositiveBigIntegerField(default=0)
    token_count = models.PositiveBigIntegerField(default=0)

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["tenant", "agent", "-created_at"], name="session_agent_created"),
            models.Index(fields=["tenant", "status", "last_accessed_at"], name="session_status_access"),
            models.Index(fields=["tenant", "user_id"], name="session_user"),
            models.Index(fields=["status", "expires_at"], name="session_status_expires"),
            models.Index(fields=["agent", "status", "last_accessed_at"], name="session_agent_live_lru"),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_live(self) -> bool:
        return self.status == SessionStatus.OPEN


class MessageRole(models.TextChoices):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Message(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveBigIntegerField()
    role = models.CharField(max_length=16, choices=MessageRole.choices)
    content = models.TextField(blank=True, default="")
    token_count = models.PositiveIntegerField(default=0)
    turn_id = models.CharField(max_length=200, blank=True, default="")
    tool_call_id = models.CharField(max_length=200, blank=True, default="")
    tool_calls = models.JSONField(default=list, blank=True)
    event_kind = models.CharField(max_length=64, blank=True, default="")
    parent_seq = models.PositiveBigIntegerField(null=True, blank=True)
    artifact_refs = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["session", "seq"], name="message_session_seq_unique")
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq}"


class TaskStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @classmethod
    def finished(cls) -> set[str]:
        return {cls.SUCCEEDED, cls.FAILED}


class ValueTier(models.TextChoices):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


class Task(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tasks")
    public_id = models.CharField(max_length=32, unique=True, default=new_task_id, editable=False)
    session = models.ForeignKey(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="tasks"
    )
    agent = models.ForeignKey(Agent, on_delete=models.SET_NULL, null=True, blank=True, related_name="tasks")
    user_id = models.CharField(max_length=200, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")
    input = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.PENDING)
    value_tier = models.CharField(max_length=16, choices=ValueTier.choices, default=ValueTier.NORMAL)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["tenant", "created_at"], name="task_tenant_created"),
            models.Index(fields=["expires_at"], name="task_expires"),
        ]

    def __str__(self) -> str:
        return self.public_id


class SessionRetentionPolicy(TenantPolicyBase):
    """How long a tenant's sessions, tasks and events live (memory/services/retention.py).

    Defaults are DESIGN.md §5's starting numbers. Edited in the admin, inline on the tenant.
    """

    session_idle_ttl_hours = models.PositiveIntegerField(
        default=24, help_text="An open session not read or written for this long becomes expired."
    )
    max_live_sessions_per_agent = models.PositiveIntegerField(
        default=100, help_text="Open sessions per agent; beyond this the least recently accessed are evicted."
    )
    task_retention_days = models.PositiveIntegerField(
        default=7, help_text="Tasks older than this are purged (their events stay)."
    )
    max_tasks = models.PositiveIntegerField(
        default=1000, help_text="Tasks kept per tenant; beyond this the oldest are purged."
    )
    event_retention_days = models.PositiveIntegerField(
        default=90,
        help_text="Events older than this are deleted from the flight recorder. 0 keeps them forever.",
    )

    class Meta:
        verbose_name = "session retention policy"
        verbose_name_plural = "session retention policy"

    def __str__(self) -> str:
        return f"retention of {self.tenant_id}"
