"""OpenTelemetry ingest: which spans were recorded, and which session each conversation became."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone

from memory.models.sessions import Agent, Session
from memory.models.tenancy import Tenant

__all__ = ["OtelConversation", "OtelHeldSpan", "OtelSpan"]


class OtelConversation(models.Model):
    """The ctxapp session a `gen_ai.conversation.id` of an agent maps to (created on first sight).

    A trace that names no conversation is one by its trace id; `history_digest` is then the
    digest of its session's messages in order (otel_ingest.conversations.history_digests), so a later
    trace whose input history extends them continues that session."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    conversation_id = models.CharField(max_length=255)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    history_digest = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["tenant", "agent", "conversation_id"], name="otelconversation_unique"
            )
        ]
        indexes: ClassVar = [
            models.Index(
                fields=["tenant", "agent", "history_digest"],
                condition=~models.Q(history_digest=""),
                name="otelconversation_history",
            )
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id} → {self.session_id}"


class OtelSpan(models.Model):
    """A span already recorded: a re-sent batch finds its spans here and records nothing twice."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    operation = models.CharField(max_length=64, blank=True, default="")
    session = models.ForeignKey(Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "trace_id", "span_id"], name="otelspan_unique")
        ]

    def __str__(self) -> str:
        return f"{self.trace_id}/{self.span_id}"


class OtelHeldSpan(models.Model):
    """A span that arrived before its trace said which agent and conversation it belongs to (a
    child exported before its parent): held until its root or a span naming them arrives, or
    until the hold bound passes (otel_ingest.ingest.HOLD_SECONDS), then recorded like any span."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    trace_id = models.CharField(max_length=32)
    span_id = models.CharField(max_length=16)
    span = models.BinaryField()  # the OTLP Span, protobuf-encoded
    resource = models.JSONField(default=dict)
    bound_agent = models.CharField(max_length=200, blank=True, default="")  # the sender's key's
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "trace_id", "span_id"], name="otelheldspan_unique")
        ]
        indexes: ClassVar = [models.Index(fields=["tenant", "received_at"], name="otelheldspan_received")]

    def __str__(self) -> str:
        return f"{self.trace_id}/{self.span_id} (held)"
