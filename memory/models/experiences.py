"""Experiences: long-term memory distilled from finished tasks, or promoted from sessions.

An experience is never edited into something else: a near-duplicate MERGES into the older row
(the new row is kept, hidden, with `merged_into`), a contradiction SUPERSEDES it (the older row is
kept, hidden, with `superseded_by`). `active` rows are those neither merged nor superseded.
"""

from __future__ import annotations

from typing import ClassVar

from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.db import models
from django.utils import timezone
from pgvector.django import HnswIndex, VectorField

from memory.ids import new_exp_id
from memory.models.sessions import Session, Task
from memory.models.tenancy import Tenant, TenantPolicyBase

EMBEDDING_DIMENSIONS = 384
FULL_TEXT_CONFIG = "english"

__all__ = [
    "PROMOTED_KINDS",
    "EmbeddingCache",
    "EmbeddingStatus",
    "Experience",
    "ExperienceFeedback",
    "ExperienceKind",
    "ExperiencePolicy",
    "ExperienceScope",
    "ExtractionMethod",
]


class EmbeddingStatus(models.TextChoices):
    PENDING = "pending"
    COMPLETED = "completed"
    FAILED = "failed"


class ExtractionMethod(models.TextChoices):
    DIRECT = "direct"
    PATTERN = "pattern"
    SUMMARY = "summary"
    MANUAL = "manual"  # written through the API
    PROMOTED = "promoted"  # promoted from a session (preference, project configuration, constraint)


class ExperienceScope(models.TextChoices):
    TENANT = "tenant"
    USER = "user"


class ExperienceKind(models.TextChoices):
    EXPERIENCE = "experience"
    PREFERENCE = "preference"
    PROJECT_CONFIG = "project_config"
    CONSTRAINT = "constraint"
    FACT = "fact"  # a promoted goal or critical piece of information


# The kinds that hold a promoted statement (key → value), not a problem and its solution.
PROMOTED_KINDS = frozenset(
    {ExperienceKind.PREFERENCE, ExperienceKind.PROJECT_CONFIG, ExperienceKind.CONSTRAINT, ExperienceKind.FACT}
)


class Experience(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="experiences")
    public_id = models.CharField(max_length=32, unique=True, default=new_exp_id, editable=False)
    user_id = models.CharField(max_length=200, blank=True, default="")
    scope = models.CharField(max_length=16, choices=ExperienceScope.choices, default=ExperienceScope.TENANT)
    kind = models.CharField(max_length=32, choices=ExperienceKind.choices, default=ExperienceKind.EXPERIENCE)
    key = models.CharField(
        max_length=200, blank=True, default="", help_text="Promoted items: the fact's key."
    )
    agent = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="External id of the agent that recorded it.",
    )

    problem = models.TextField()
    cause = models.TextField(blank=True, default="")
    solution = models.TextField(blank=True, default="")
    confidence = models.FloatField(default=0.5)
    extraction_method = models.CharField(max_length=16, choices=ExtractionMethod.choices)
    source_task = models.ForeignKey(Task, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    source_session = models.ForeignKey(
        Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # One entry per contribution: {"method", "task", "session", "message_seqs", "at", "merged_from"?}
    provenance = models.JSONField(default=list, blank=True)
    # Texts of near-identical experiences merged into this one, one per line: part of the full-text
    # vector, so a merged duplicate's own wording stays findable (docs/experiences.md, "Merge").
    aliases = models.TextField(blank=True, default="")
    # False when created with `merge: false`: this row never merges into another one.
    mergeable = models.BooleanField(default=True)

    # Embedding: the text embedded is problem + cause + solution (Experience.embedding_text).
    text_hash = models.CharField(max_length=64, db_index=True)
    embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    # The problem alone ("Problem: …"): a question usually paraphrases the problem, not the fix;
    # search blends both cosines (docs/experiences.md, "Hybrid search").
    problem_embedding = VectorField(dimensions=EMBEDDING_DIMENSIONS, null=True, blank=True)
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    embedding_dimensions = models.PositiveSmallIntegerField(null=True, blank=True)
    embedding_status = models.CharField(
        max_length=16, choices=EmbeddingStatus.choices, default=EmbeddingStatus.PENDING
    )
    embedding_error = models.TextField(blank=True, default="")
    embedding_attempts = models.PositiveIntegerField(
        default=0, help_text="Embedding jobs that wrote this row."
    )
    embedded_at = models.DateTimeField(null=True, blank=True)
    # Full text, maintained by PostgreSQL itself: a pending row is findable at once.
    search_vector = models.GeneratedField(
        expression=SearchVector("problem", weight="A", config=FULL_TEXT_CONFIG)
        + SearchVector("cause", weight="B", config=FULL_TEXT_CONFIG)
        + SearchVector("solution", weight="B", config=FULL_TEXT_CONFIG)
        + SearchVector("aliases", weight="C", config=FULL_TEXT_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    use_count = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)
    helpful_count = models.PositiveIntegerField(default=0)
    unhelpful_count = models.PositiveIntegerField(default=0)
    merge_count = models.PositiveIntegerField(default=0)

    merged_into = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="merged_from"
    )
    merged_at = models.DateTimeField(null=True, blank=True)
    superseded_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="supersedes"
    )
    superseded_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes: ClassVar = [
            HnswIndex(
                name="experience_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
            GinIndex(fields=["search_vector"], name="experience_search_gin"),
            models.Index(fields=["tenant", "embedding_status"], name="experience_status"),
            models.Index(fields=["tenant", "last_used_at"], name="experience_last_used"),
            models.Index(fields=["tenant", "user_id"], name="experience_user"),
            models.Index(fields=["tenant", "agent"], name="experience_agent"),
            models.Index(fields=["tenant", "kind", "user_id", "key"], name="experience_kind_key"),
            models.Index(fields=["tenant", "text_hash"], name="experience_tenant_text"),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_active(self) -> bool:
        return self.merged_into_id is None and self.superseded_by_id is None

    @staticmethod
    def compose_text(problem: str, cause: str, solution: str, kind: str = "") -> str:
        """The text that is embedded, hashed and put into prompts. A promoted preference,
        configuration, constraint or fact reads as what it states ("Fact (primary_db): The
        primary database is db-1"), not as a problem with a solution."""
        if kind in PROMOTED_KINDS and solution.strip():
            return f"{problem.strip()}: {solution.strip()}"
        parts = [f"Problem: {problem.strip()}"]
        if cause.strip():
            parts.append(f"Cause: {cause.strip()}")
        if solution.strip():
            parts.append(f"Solution: {solution.strip()}")
        return "\n".join(parts)

    @property
    def text(self) -> str:
        return self.compose_text(self.problem, self.cause, self.solution, self.kind)

    @property
    def problem_text(self) -> str:
        return f"Problem: {self.problem.strip()}"


class ExperienceFeedback(models.Model):
    """One outcome report of an agent that used an experience (helpful or not)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    experience = models.ForeignKey(Experience, on_delete=models.CASCADE, related_name="feedback")
    helpful = models.BooleanField()
    note = models.TextField(blank=True, default="")
    session = models.ForeignKey(Session, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{'helpful' if self.helpful else 'unhelpful'} on {self.experience_id}"


class EmbeddingCache(models.Model):
    """Vectors by (tenant, model, sha256 of the text): a tenant's text is never embedded twice by a model.

    Per tenant: a hit shared across tenants would tell one tenant that another embedded the same
    text, and erasing one tenant's texts (forget, redact, delete) could take rows another relies on.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200)
    text_hash = models.CharField(max_length=64)
    dimensions = models.PositiveSmallIntegerField()
    vector = VectorField(dimensions=EMBEDDING_DIMENSIONS)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["tenant", "model", "text_hash"], name="embedding_cache_tenant_model_text_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.model}:{self.text_hash[:12]}"


class ExperiencePolicy(TenantPolicyBase):
    """Per-tenant numbers of experience memory (defaults from the design's source documents)."""

    capacity = models.PositiveIntegerField(
        default=5000, help_text="Most experiences kept; the least recently used are evicted beyond it."
    )
    merge_threshold = models.FloatField(
        default=0.97,
        help_text="Cosine at or above which a new experience may merge into an existing one "
        "(near-identical texts only; the token overlap must also hold).",
    )
    merge_token_overlap = models.FloatField(
        default=0.8,
        help_text="Word overlap (Jaccard of the two texts' word sets) at or above which a merge may happen.",
    )
    supersede_problem_threshold = models.FloatField(
        default=0.85,
        help_text="Cosine of the problems above which two experiences describe the same problem.",
    )
    solution_agreement_threshold = models.FloatField(
        default=0.75,
        help_text="Cosine of the solutions below which a newer experience on the same problem supersedes.",
    )
    vector_weight = models.FloatField(default=1.0, help_text="Hybrid search: weight of cosine similarity.")
    text_weight = models.FloatField(
        default=0.1, help_text="Hybrid search: weight of the full-text score (normalised to 0..1)."
    )
    context_min_similarity = models.FloatField(
        default=0.3, help_text="Experiences less similar than this to the input never enter a context."
    )
    # 0: on retrieval_dev, feedback lowered held-out ranking at every weight tried (bench/bench_feedback.py).
    helpful_weight = models.FloatField(
        default=0.0, help_text="Context ranking: weight of the helpful/unhelpful feedback balance (-1..1)."
    )

    class Meta:
        verbose_name = "experience policy"
        verbose_name_plural = "experience policy"
