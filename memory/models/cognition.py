"""Cognitive state, checkpoints, the three task context layers and declared reducers.

JSON documents an agent writes (its state, checkpoint snapshots and deltas) are kept as text, not
jsonb: PostgreSQL's jsonb reorders object keys, and a state must round-trip exactly as written.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.utils import timezone

from memory.ids import new_ckpt_id, new_public_id
from memory.models.sessions import Agent, Task
from memory.models.tenancy import Tenant, TenantPolicyBase

STATE_SCHEMA_VERSION = 1


def empty_state() -> dict[str, Any]:
    """The empty schema-1 state document (what an agent that never wrote a state has)."""
    return {
        "context": {"goal": None, "constraints": []},
        "observation": None,
        "working_memory": {},
        "decision": None,
        "tool_state": {},
    }


def new_ipc_id() -> str:
    return new_public_id("ipc")


class CognitiveState(models.Model):
    """The current cognitive state of one agent (one row per agent).

    `document` is the schema-1 state as JSON text: context, observation, working_memory, decision,
    tool_state. `checkpoint` points at the latest checkpoint taken (or restored to).
    `checkpoint_seq` is the agent's checkpoint counter: advanced under this row's lock, so
    checkpoint seqs are handed out without gaps.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="cognitive_state")
    schema_version = models.PositiveSmallIntegerField(default=STATE_SCHEMA_VERSION)
    document = models.TextField(default="{}")
    version = models.PositiveBigIntegerField(default=0, help_text="Incremented by every write.")
    checkpoint = models.ForeignKey(
        "Checkpoint", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    checkpoint_seq = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)
    # A fold of the agent's events up to fold_seq, left by a recovery that had to fold many events
    # (an agent that rarely checkpoints): the next recovery starts from it. A cache, like
    # Checkpoint.fold_state.
    fold_state = models.TextField(blank=True, default="")
    fold_seq = models.PositiveBigIntegerField(default=0)
    fold_reducers_sha256 = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"state of {self.agent_id} v{self.version}"


class CheckpointStorage(models.TextChoices):
    FULL = "full"
    DELTA = "delta"


class Checkpoint(models.Model):
    """An immutable snapshot of an agent's cognitive state.

    Stored either in full or as a delta (a list of JSON-path operations, see
    memory/services/cognition/storage.py) from the checkpoint `base_seq` of the same agent. Pruning may
    re-base a delta (rewrite its storage) but never changes the state it reconstructs to; that
    state's SHA-256 is kept in `state_sha256` and verified on every reconstruction.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="checkpoints")
    public_id = models.CharField(max_length=32, unique=True, default=new_ckpt_id, editable=False)
    seq = models.PositiveBigIntegerField()
    reason = models.CharField(max_length=200, blank=True, default="")
    step = models.BigIntegerField(null=True, blank=True, help_text="The agent's step that produced it.")
    produced_by = models.CharField(max_length=200, blank=True, default="", help_text="Event id or label.")
    covers_event_seq = models.PositiveBigIntegerField(
        help_text="The agent's stream seq this checkpoint covers (its own checkpoint.created event)."
    )
    schema_version = models.PositiveSmallIntegerField(default=STATE_SCHEMA_VERSION)
    storage = models.CharField(max_length=8, choices=CheckpointStorage.choices)
    base_seq = models.PositiveBigIntegerField(null=True, blank=True)
    delta_depth = models.PositiveIntegerField(
        default=0, help_text="Deltas between this and its full snapshot."
    )
    payload = models.TextField(help_text="Full state JSON, or the delta's operations as JSON.")
    state_sha256 = models.CharField(max_length=64)
    state_bytes = models.PositiveIntegerField(default=0)
    # The fold of the agent's events up to covers_event_seq, under the reducers of `reducers_sha256`:
    # recovery folds only the events after it instead of the whole stream. A cache, kept on the
    # newest checkpoint and on full snapshots only (cleared on the others).
    fold_state = models.TextField(blank=True, default="")
    reducers_sha256 = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["agent", "seq"], name="checkpoint_agent_seq_unique")
        ]
        indexes: ClassVar = [models.Index(fields=["tenant", "agent", "-seq"], name="checkpoint_agent_seq")]

    def __str__(self) -> str:
        return f"{self.public_id} (#{self.seq})"


class AgentBlob(models.Model):
    """A large value an agent keeps beside its checkpoints and events, which carry a reference to
    it (its SHA-256) instead of the bytes: a LangGraph channel value too large for a checkpoint
    state or an event payload (ctxapp/integrations/_langgraph_core.py). Addressed by content, so
    storing the same bytes again stores nothing; deleted with its agent."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="blobs")
    sha256 = models.CharField(max_length=64)
    size = models.PositiveBigIntegerField()
    data = models.BinaryField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [models.UniqueConstraint(fields=["agent", "sha256"], name="agentblob_unique")]

    def __str__(self) -> str:
        return f"{self.agent_id}/{self.sha256[:12]}"


class CheckpointPolicy(TenantPolicyBase):
    """Checkpoint retention: keep the last N, plus one per hour and one per day for a while."""

    keep_last = models.PositiveIntegerField(default=50, help_text="Newest checkpoints always kept.")
    keep_hourly_hours = models.PositiveIntegerField(
        default=24, help_text="For this many hours back, the newest checkpoint of each hour is kept."
    )
    keep_daily_days = models.PositiveIntegerField(
        default=30, help_text="For this many days back, the newest checkpoint of each day is kept."
    )
    full_snapshot_every = models.PositiveIntegerField(
        default=20, help_text="Every K-th checkpoint is stored in full; the others as deltas."
    )

    class Meta:
        verbose_name_plural = "checkpoint policies"

    def __str__(self) -> str:
        return f"checkpoint policy of {self.tenant_id}"


class TaskContext(models.Model):
    """Task-shared context: every agent on the task sees it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="shared_context")
    goal = models.TextField(blank=True, default="")
    constraints = models.JSONField(default=list, blank=True)
    artifacts = models.JSONField(default=list, blank=True)
    decisions = models.JSONField(default=list, blank=True)
    dependencies = models.JSONField(default=list, blank=True)
    version = models.PositiveBigIntegerField(default=0)
    updated_by = models.ForeignKey(Agent, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"shared context of {self.task_id} v{self.version}"


class PrivateContext(models.Model):
    """Agent-private context on a task: only the agent it belongs to ever reads it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    document = models.TextField(default="{}")
    version = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["task", "agent"], name="private_context_task_agent_unique")
        ]

    def __str__(self) -> str:
        return f"private context of {self.agent_id} on {self.task_id}"


class IpcMessage(models.Model):
    """A message from one agent to another (or to every agent, `recipient` null) on a task."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    public_id = models.CharField(max_length=32, unique=True, default=new_ipc_id, editable=False)
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="ipc_messages")
    sender = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    recipient = models.ForeignKey(Agent, on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    body = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes: ClassVar = [models.Index(fields=["task", "id"], name="ipc_task_id")]

    def __str__(self) -> str:
        return self.public_id


class IpcReceipt(models.Model):
    """That `agent` has read `message` (a broadcast has one receipt per reader)."""

    message = models.ForeignKey(IpcMessage, on_delete=models.CASCADE, related_name="receipts")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    read_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["message", "agent"], name="ipc_receipt_unique")
        ]

    def __str__(self) -> str:
        return f"{self.message_id} read by {self.agent_id}"


class ReducerOp(models.TextChoices):
    SET = "set"
    MERGE = "merge"
    APPEND = "append"


class AgentReducer(models.Model):
    """A declared reducer: how one `agent.*` event type changes the agent's custom state.

    Data, never code: `op` applies the payload value at `source` (a dotted path, empty = the whole
    payload) to the custom state at `target` (a dotted path).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="reducers")
    position = models.PositiveIntegerField()
    event_type = models.CharField(max_length=100)
    op = models.CharField(max_length=8, choices=ReducerOp.choices)
    target = models.CharField(max_length=200)
    source = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering: ClassVar = ["position"]
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["agent", "position"], name="reducer_agent_position_unique")
        ]

    def __str__(self) -> str:
        return f"{self.event_type}: {self.op} {self.target}"


__all__ = [
    "STATE_SCHEMA_VERSION",
    "AgentBlob",
    "AgentReducer",
    "Checkpoint",
    "CheckpointPolicy",
    "CheckpointStorage",
    "CognitiveState",
    "IpcMessage",
    "IpcReceipt",
    "PrivateContext",
    "ReducerOp",
    "TaskContext",
    "empty_state",
]
