"""Decay detection: tracked facts, their references, the per-session round counter, the policy."""

from __future__ import annotations

from typing import ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from memory.ids import new_public_id
from memory.models.sessions import Session
from memory.models.tenancy import Tenant, TenantPolicyBase

__all__ = [
    "HIGH_IMPORTANCE_TYPES",
    "MEDIUM_IMPORTANCE_TYPES",
    "DecayPolicy",
    "FactImportance",
    "FactReference",
    "FactRoundCounter",
    "FactScope",
    "TrackedFact",
    "fact_importance_of",
]


def new_fact_id() -> str:
    return new_public_id("fact")


class FactImportance(models.TextChoices):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


HIGH_IMPORTANCE_TYPES = frozenset({"user_preference", "constraint", "goal", "critical_info"})
MEDIUM_IMPORTANCE_TYPES = frozenset({"decision", "state", "progress"})


def fact_importance_of(fact_type: str) -> str:
    """Importance derived from a fact's type (DESIGN §5); any other type is low."""
    if fact_type in HIGH_IMPORTANCE_TYPES:
        return FactImportance.HIGH
    if fact_type in MEDIUM_IMPORTANCE_TYPES:
        return FactImportance.MEDIUM
    return FactImportance.LOW


IMPORTANCE_RANK: dict[str, int] = {FactImportance.HIGH: 0, FactImportance.MEDIUM: 1, FactImportance.LOW: 2}


class FactScope(models.TextChoices):
    SESSION = "session"
    USER = "user"


class TrackedFact(models.Model):
    """A fact of a session whose presence in the model's attention ctxapp watches.

    Rounds are the session's user turns (FactRoundCounter). `last_referenced_round` starts at the
    registration round; a fact is decayed once the session is `threshold` rounds past it. `decayed`
    and `decayed_round` hold the current crossing (cleared by the next reference); `decay_count`
    counts crossings, one `fact.decayed` event each.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    public_id = models.CharField(max_length=32, unique=True, default=new_fact_id, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="tracked_facts")
    scope = models.CharField(max_length=16, choices=FactScope.choices, default=FactScope.SESSION)
    user_id = models.CharField(max_length=200, blank=True, default="")
    key = models.CharField(max_length=200)
    fact_type = models.CharField(max_length=64)
    content = models.TextField()
    importance = models.CharField(max_length=8, choices=FactImportance.choices)
    source = models.CharField(max_length=16, default="api", help_text='"api" or "message" (auto-registered).')
    source_seq = models.PositiveBigIntegerField(null=True, blank=True)
    key_terms = models.JSONField(default=list, blank=True)
    embedding = models.JSONField(null=True, blank=True)
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    registered_round = models.PositiveIntegerField(default=0)
    last_referenced_round = models.PositiveIntegerField(default=0)
    reference_count = models.PositiveIntegerField(default=0)
    last_referenced_at = models.DateTimeField(null=True, blank=True)
    last_injected_round = models.PositiveIntegerField(null=True, blank=True)
    last_injected_at = models.DateTimeField(null=True, blank=True)
    injection_count = models.PositiveIntegerField(default=0)
    decayed = models.BooleanField(default=False)
    decayed_round = models.PositiveIntegerField(null=True, blank=True)
    decayed_at = models.DateTimeField(null=True, blank=True)
    decay_count = models.PositiveIntegerField(default=0)
    promoted_at = models.DateTimeField(null=True, blank=True)
    promoted_ref = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["session", "key"], name="trackedfact_session_key_unique")
        ]
        indexes: ClassVar = [
            models.Index(fields=["tenant", "session", "decayed"], name="trackedfact_session_decayed"),
            models.Index(fields=["tenant", "user_id"], name="trackedfact_user"),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.key}"


class FactReference(models.Model):
    """One time a fact was referenced: by a message, a built context, or explicitly."""

    class Method(models.TextChoices):
        REGISTERED = "registered"
        KEY_TERMS = "key_terms"
        EMBEDDING = "embedding"
        EXPLICIT = "explicit"
        RESTATED = "restated"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    fact = models.ForeignKey(TrackedFact, on_delete=models.CASCADE, related_name="references")
    round = models.PositiveIntegerField()
    method = models.CharField(max_length=16, choices=Method.choices)
    message_seq = models.PositiveBigIntegerField(null=True, blank=True)
    score = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes: ClassVar = [models.Index(fields=["fact", "round"], name="factref_fact_round")]

    def __str__(self) -> str:
        return f"{self.fact_id}@{self.round} ({self.method})"


class FactRoundCounter(models.Model):
    """The number of user turns (rounds) of a session, advanced under the session's append lock."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="fact_rounds")
    rounds = models.PositiveIntegerField(default=0)
    last_user_seq = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.session_id}: {self.rounds} rounds"


FRACTION_VALIDATORS = [MinValueValidator(0.0), MaxValueValidator(1.0)]


class DecayPolicy(TenantPolicyBase):
    """A tenant's decay and compression numbers (defaults: DESIGN §5).

    The risky middle band of a prompt is the context engine's (ContextPolicy.middle_start/end).
    """

    decay_rounds = models.PositiveIntegerField(
        default=20, help_text="Rounds without reference before a fact decays."
    )
    decay_rounds_high = models.PositiveIntegerField(
        default=10, help_text="Rounds without reference before a high-importance fact decays."
    )
    reference_term_overlap = models.FloatField(
        default=0.5,
        validators=FRACTION_VALIDATORS,
        help_text="Share of a fact's key terms a message must contain to reference it.",
    )
    reference_min_terms = models.PositiveIntegerField(
        default=2,
        help_text="Key terms a message must share with a fact (fewer only when the fact has fewer).",
    )
    reference_use_embeddings = models.BooleanField(
        default=True,
        help_text="Check embedding similarity when key-term overlap is inconclusive (needs the embedder).",
    )
    reference_similarity = models.FloatField(
        default=0.55,
        validators=FRACTION_VALIDATORS,
        help_text="Cosine similarity above which a message references a fact.",
    )
    pin_high_importance = models.BooleanField(
        default=True, help_text="Pin every high-importance fact at the start of each built context."
    )
    restate_medium = models.BooleanField(
        default=False, help_text="Also restate decayed medium-importance facts in built contexts."
    )
    auto_register = models.BooleanField(
        default=True,
        help_text="Register facts from messages whose event_kind marks a decision, constraint, …",
    )
    compression_target_ratio = models.FloatField(default=0.3, validators=FRACTION_VALIDATORS)
    compression_recent_messages = models.PositiveIntegerField(
        default=10, help_text="The newest messages that get the +20 recency bonus."
    )
    priority_decision = models.PositiveIntegerField(default=100)
    priority_error = models.PositiveIntegerField(default=90)
    priority_code = models.PositiveIntegerField(default=70)
    priority_conversation = models.PositiveIntegerField(default=50)
    bonus_recent = models.PositiveIntegerField(default=20)
    bonus_important = models.PositiveIntegerField(default=30)
    bonus_success = models.PositiveIntegerField(default=10)

    class Meta:
        verbose_name = "decay policy"
        verbose_name_plural = "decay policy"

    def clean(self) -> None:
        errors = {}
        if self.decay_rounds < 1 or self.decay_rounds_high < 1:
            errors["decay_rounds"] = "A fact needs at least one round to decay."
        if errors:
            raise ValidationError(errors)

    def threshold_for(self, importance: str) -> int:
        return self.decay_rounds_high if importance == FactImportance.HIGH else self.decay_rounds
