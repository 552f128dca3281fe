"""The flight recorder: an append-only event log with a gapless seq per stream."""

from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone

from memory.ids import new_evt_id
from memory.models.sessions import Agent, Session
from memory.models.tenancy import Tenant


class EventStream(models.Model):
    """The seq counter of one stream. Incremented under its row lock, so seqs are gapless.

    A stream is an agent (key `agent:<external id>`) or the tenant itself (key `tenant`),
    for events no agent owns (experience eviction, for instance).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    last_seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "key"], name="stream_tenant_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.key} (last seq {self.last_seq})"


class Event(models.Model):
    """One recorded fact. Never updated; only retention deletes events."""

    # tenant and session are indexed through the composite indexes below, which lead with them;
    # public ids are looked up by equality only (no LIKE index). Every index is written per event.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    public_id = models.CharField(max_length=32, default=new_evt_id, editable=False)
    stream = models.CharField(max_length=255)
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=100)
    agent = models.ForeignKey(Agent, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    session = models.ForeignKey(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="+", db_index=False
    )
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "stream", "seq"], name="event_stream_seq_unique"),
            models.UniqueConstraint(fields=["public_id"], name="event_public_id_unique"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["tenant", "type", "created_at"], name="event_type_created"),
            models.Index(fields=["tenant", "created_at"], name="event_tenant_created"),
            models.Index(fields=["session", "seq"], name="event_session_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.stream}#{self.seq} {self.type}"
