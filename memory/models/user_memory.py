"""Memory about a user: durable facts, preferences, decisions, constraints and plans of one person.

A user is the `user_id` a tenant puts on its sessions. A memory is never edited into another value:
a new value for the same subject SUPERSEDES the current one (the old row gets `valid_to` and
`superseded_by`), so `as_of` can show any past moment. At most one memory per (tenant, user,
subject) is current, which the partial unique constraint below enforces.
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.db.models import Q
from django.utils import timezone
from pgvector.django import HnswIndex, VectorField

from memory.ids import new_public_id
from memory.models.experiences import EMBEDDING_DIMENSIONS, FULL_TEXT_CONFIG, EmbeddingStatus
from memory.models.tenancy import Tenant

__all__ = ["UserMemory", "UserMemoryOrigin", "UserMemoryType", "new_user_memory_id"]


def new_user_memory_id() -> str:
    return new_public_id("umem")


class UserMemoryType(models.TextChoices):
    PROFILE = "profile"  # name, home, work, family, pets, age…
    PREFERENCE = "preference"
    DECISION = "decision"
    CONSTRAINT = "constraint"
    PLAN = "plan"
    FACT = "fact"


class UserMemoryOrigin(models.TextChoices):
    API = "api"  # written through the API, the client, MCP or the CLI
    EXTRACTED = "extracted"  # extracted from a conversation without a model (patterns)
    MODEL = "model"  # extracted by the configured chat endpoint


class UserMemory(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    public_id = models.CharField(max_length=32, unique=True, default=new_user_memory_id, editable=False)
    user_id = models.CharField(max_length=200)
    subject = models.CharField(
        max_length=200,
        help_text="What the memory is about (e.g. 'home.city'); a new value for the same subject "
        "supersedes the current one.",
    )
    memory_type = models.CharField(max_length=16, choices=UserMemoryType.choices, default=UserMemoryType.FACT)
    text = models.TextField()
    # One entry per conversation turn it was taken from: {"session": public id, "seq": int}.
    sources = models.JSONField(default=list, blank=True)
    confidence = models.FloatField(default=1.0)
    origin = models.CharField(max_length=16, choices=UserMemoryOrigin.choices, default=UserMemoryOrigin.API)
    agent = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="External id of the agent whose session it came from.",
    )

    valid_from = models.DateTimeField(default=timezone.now)
    valid_to = models.DateTimeField(null=True, blank=True)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="supersedes"
    )

    text_hash = models.CharField(max_length=64, blank=True, default="")
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedding_status = models.CharField(
        max_length=16, choices=EmbeddingStatus.choices, default=EmbeddingStatus.PENDING
    )
    search_vector = models.GeneratedField(
        expression=SearchVector("text", weight="A", config=FULL_TEXT_CONFIG)
        + SearchVector("subject", weight="B", config=FULL_TEXT_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["tenant", "user_id", "subject"],
                condition=Q(valid_to__isnull=True),
                name="usermemory_one_current_per_subject",
            ),
        ]
        indexes: ClassVar = [
            models.Index(fields=["tenant", "user_id", "subject", "valid_from"], name="usermemory_subject"),
            models.Index(
                fields=["tenant", "user_id"], condition=Q(valid_to__isnull=True), name="usermemory_current"
            ),
            GinIndex(fields=["search_vector"], name="usermemory_search_gin"),
            HnswIndex(
                name="usermemory_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.user_id}:{self.subject}"

    @property
    def is_current(self) -> bool:
        return self.valid_to is None
