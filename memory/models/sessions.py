"""Agents, their sessions and messages, and tasks (execution records)."""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.core.exceptions import ValidationError
from django.db import connection, models
from django.db.models import F, Q
from django.utils import timezone
from pgvector.django import HnswIndex, VectorField

from memory.ids import new_sess_id, new_task_id
from memory.models.tenancy import Tenant, TenantPolicyBase

__all__ = [
    "Agent",
    "MemoryIndexState",
    "MemoryPolicy",
    "Message",
    "MessageEmbeddingStatus",
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
    # No index of their own on tenant, agent and public_id's LIKE patterns: the composite indexes
    # below lead with tenant and agent, and public ids are looked up by equality only. Every index
    # is written on each append (docs/benchmarks.md, bench_peers.py).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sessions", db_index=False)
    public_id = models.CharField(max_length=32, default=new_sess_id, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sessions", db_index=False)
    user_id = models.CharField(max_length=200, blank=True, default="")
    model_name = models.CharField(max_length=200, blank=True, default="")
    # The application's own id of the conversation (unique per agent; null when not given), so an
    # app can address the session without keeping a map to `sess_…` ids.
    key = models.CharField(max_length=200, null=True, blank=True)
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
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["public_id"], name="session_public_id_unique"),
            models.UniqueConstraint(
                fields=["tenant", "agent", "key"],
                condition=Q(key__isnull=False),
                name="session_agent_key_unique",
            ),
        ]
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


MESSAGE_EMBEDDING_DIMENSIONS = 384


class RegConfigField(models.CharField):
    """A PostgreSQL `regconfig` (a text-search configuration such as `english` or `simple`).

    A generated tsvector may only use immutable expressions: `to_tsvector(regconfig_column, text)`
    is one, `to_tsvector(text_column::regconfig, text)` is not; hence a real regconfig column.
    """

    def db_type(self, connection: object) -> str:
        return "regconfig"

    def from_db_value(self, value: object, expression: object, connection: object) -> str | None:
        return None if value is None else str(value)


class MessageEmbeddingStatus(models.TextChoices):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"  # the tenant's MemoryPolicy turns message embedding off


class Message(models.Model):
    # Indexed through message_tenant_occurred and message_session_seq_unique, which lead with them.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages", db_index=False)
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
    # Who spoke (OpenAI's message `name`); indexed with the content, so "what did Ana say" finds it.
    name = models.CharField(max_length=200, blank=True, default="")
    # When it was said: the client's clock (history imports), else the append time.
    occurred_at = models.DateTimeField(default=timezone.now)
    # The tenant's MemoryPolicy.text_search_config at write time (see RegConfigField).
    search_config = RegConfigField(max_length=64, default="english")
    search_vector = models.GeneratedField(
        expression=SearchVector("name", weight="B", config=F("search_config"))
        + SearchVector("content", weight="A", config=F("search_config")),
        output_field=SearchVectorField(),
        db_persist=True,
    )
    # Semantic index, filled asynchronously in coalesced batches (memory/services/message_indexing.py).
    embedding = VectorField(dimensions=MESSAGE_EMBEDDING_DIMENSIONS, null=True, blank=True)
    embedding_status = models.CharField(
        max_length=16, choices=MessageEmbeddingStatus.choices, default=MessageEmbeddingStatus.PENDING
    )
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedding_attempts = models.PositiveSmallIntegerField(default=0)
    embedding_error = models.CharField(max_length=2000, blank=True, default="")

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["session", "seq"], name="message_session_seq_unique")
        ]
        indexes: ClassVar = [
            # A small pending list (kB; PostgreSQL's default is 4 MB): every search scans the whole
            # list until it is merged, and a bulk import would leave it full until autovacuum.
            GinIndex(fields=["search_vector"], name="message_search_gin", gin_pending_list_limit=256),
            HnswIndex(
                name="message_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
            # The embedding drain's queue: only pending rows, oldest first.
            models.Index(
                fields=["created_at"],
                name="message_embedding_pending",
                condition=Q(embedding_status="pending"),
            ),
            models.Index(fields=["tenant", "occurred_at"], name="message_tenant_occurred"),
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


class MemoryPolicy(TenantPolicyBase):
    """How a tenant's conversational memory is indexed and recalled (docs/memory.md)."""

    text_search_config = models.CharField(
        max_length=64,
        default="english",
        help_text="PostgreSQL text-search configuration of new messages (english, german, french, …; "
        "`simple` for languages without one: no stemming, no stop words).",
    )
    embed_messages = models.BooleanField(
        default=True,
        help_text="Embed messages for search by meaning. Off: messages are `skipped`, still found by words.",
    )
    search_min_similarity = models.FloatField(
        default=0.15,
        help_text="Relevance floor of memory search and recall: an item sharing no word with the query "
        "needs at least this cosine to it to be listed (docs/memory.md, Ordering).",
    )
    recall_enabled = models.BooleanField(
        default=True, help_text="Context builds recall relevant items from outside the window."
    )
    recall_top_k = models.PositiveIntegerField(
        default=20,
        help_text="Most turns and records a context build recalls; the scores' drop and the budget "
        "usually cut sooner.",
    )
    recall_min_score = models.FloatField(
        default=0.3,
        help_text="Fused ranking score (z-score units of the candidate pool) an item needs to be recalled…",
    )
    recall_min_similarity = models.FloatField(
        default=0.45, help_text="…or this cosine to the query (absolute; what a small pool needs)."
    )
    recall_position = models.CharField(
        max_length=8,
        choices=[("start", "start"), ("end", "end")],
        default="start",
        help_text="Where recalled items go: at the start (after system parts) or just before the input.",
    )
    recall_budget_share = models.FloatField(
        default=0.15, help_text="Largest share of the input budget recalled items may take."
    )
    recall_max_tokens = models.PositiveIntegerField(
        default=1000,
        help_text="Most tokens recalled items may take, whatever the model's window (the budget share "
        "applies too; the smaller wins).",
    )

    class Meta:
        verbose_name = "memory policy"
        verbose_name_plural = "memory policy"

    def clean(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = %s", [self.text_search_config])
            if cursor.fetchone() is None:
                raise ValidationError(
                    {
                        "text_search_config": "PostgreSQL has no text-search configuration "
                        f"{self.text_search_config!r} (see: SELECT cfgname FROM pg_ts_config)."
                    }
                )

    def __str__(self) -> str:
        return f"memory policy of {self.tenant_id}"


class MemoryIndexState(models.Model):
    """One row (pk 1): whether a drain job of the memory index is queued and not yet started.

    Coalesces dispatches: a commit that adds pending rows queues a drain job only when none is
    waiting (a conditional UPDATE flips the flag), and the job clears the flag before it claims
    rows, so rows committed after that find the flag clear and queue the next job.
    """

    drain_scheduled = models.BooleanField(default=False)
    scheduled_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"memory index (drain scheduled: {self.drain_scheduled})"
