"""Medium-term memory: a session's structured digest, one row per version.

The summarisation job maintains it (memory/services/session_digest.py). Each update is a new version
row, so the history of what the session was about is kept; the highest version is the current one.
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.utils import timezone

from memory.models.sessions import Session
from memory.models.tenancy import Tenant

__all__ = ["DIGEST_CATEGORIES", "DigestMethod", "SessionDigest"]

# The categories of a digest, in the order they are shown and sent.
DIGEST_CATEGORIES = (
    "goals",
    "decisions",
    "findings",
    "preferences",
    "constraints",
    "progress",
    "open_questions",
)


class DigestMethod(models.TextChoices):
    OFFLINE = "offline"
    LLM = "llm"
    LLM_FALLBACK = "llm_fallback"  # the endpoint failed or answered badly; the offline extractor wrote it


class SessionDigest(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="digests")
    # Copied from the session: "the same user's previous session" is one indexed lookup.
    user_id = models.CharField(max_length=200, blank=True, default="")
    version = models.PositiveIntegerField()
    # {category: [{"text": str, "seq": int | None}]} for each of DIGEST_CATEGORIES.
    content = models.JSONField(default=dict)
    text = models.TextField(help_text="The digest rendered as text (what a prompt and search see).")
    covers_up_to_seq = models.PositiveBigIntegerField(help_text="Messages with seq ≤ this were read.")
    method = models.CharField(max_length=16, choices=DigestMethod.choices, default=DigestMethod.OFFLINE)
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    search_vector = models.GeneratedField(
        expression=SearchVector("text", config="english"),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["session", "version"], name="session_digest_version_unique")
        ]
        indexes: ClassVar = [
            models.Index(fields=["tenant", "user_id", "-created_at"], name="session_digest_user"),
            GinIndex(fields=["search_vector"], name="session_digest_search_gin"),
        ]

    def __str__(self) -> str:
        return f"digest v{self.version} of {self.session_id}"
