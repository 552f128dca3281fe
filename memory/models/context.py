"""Context engine: model profiles, context policy, rolling summaries, budget samples, usage reports."""

from __future__ import annotations

from typing import ClassVar

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from memory.ids import new_public_id
from memory.models.sessions import Session
from memory.models.tenancy import Tenant, TenantPolicyBase

__all__ = [
    "BudgetSample",
    "ContextMode",
    "ContextPolicy",
    "ModelProfile",
    "SessionContextPolicy",
    "Summary",
    "SummaryMethod",
    "TokenUsageReport",
    "default_mode_parts",
    "new_build_id",
    "new_summary_id",
]


def new_build_id() -> str:
    return new_public_id("ctx")


def new_summary_id() -> str:
    return new_public_id("sum")


def default_mode_parts() -> dict:
    return {
        "agent": {"system_parts": ["*"], "tools": True},
        "ask": {"system_parts": ["core", "ask"], "tools": False},
        "plan": {"system_parts": ["core", "plan", "mode"], "tools": False},
    }


class ContextMode(models.TextChoices):
    AGENT = "agent"
    ASK = "ask"
    PLAN = "plan"


class ModelProfile(models.Model):
    """A tenant's own model (or its override of a built-in one, matched by name)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="model_profiles")
    name = models.CharField(max_length=200, help_text="The model name agents send, e.g. my-finetune-v2.")
    provider = models.CharField(max_length=100, blank=True, default="custom")
    input_limit = models.PositiveIntegerField(validators=[MinValueValidator(256)])
    output_limit = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tokenizer = models.CharField(
        max_length=64,
        default="estimate:generic",
        help_text="o200k_base, cl100k_base (exact) or estimate:<family> (calibrated estimate).",
    )
    notes = models.CharField(max_length=500, blank=True, default="")
    # The tenant's price (what it pays, in USD per million tokens): the dashboard's trace view
    # shows a call's cost only for a model whose price is set here.
    input_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    output_usd_per_mtok = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["tenant", "name"], name="modelprofile_tenant_name_unique")
        ]
        ordering: ClassVar = ["name"]

    def __str__(self) -> str:
        return self.name


class ContextPolicy(TenantPolicyBase):
    """A tenant's context-building policy. Defaults are the documented starting numbers."""

    history_window = models.PositiveIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(10_000)],
        help_text="Most recent messages sent verbatim (10 or 30 in the sources).",
    )
    summarise_threshold = models.FloatField(
        default=0.85,
        validators=[MinValueValidator(0.05), MaxValueValidator(1.0)],
        help_text="Queue summarisation when the prompt reaches this share of the model's input window.",
    )
    keep_verbatim = models.PositiveIntegerField(
        default=5,
        validators=[MaxValueValidator(10_000)],
        help_text="Latest messages never folded into the summary.",
    )
    output_reserve = models.PositiveIntegerField(
        default=4096,
        validators=[MaxValueValidator(10_000_000)],
        help_text="Tokens kept free for the reply (capped at the model's output limit).",
    )
    char_gate = models.PositiveIntegerField(
        default=8192,
        validators=[MaxValueValidator(100_000_000)],
        help_text="Most code points the new input may have; 0 turns the character gate off.",
    )
    memory_limit = models.PositiveIntegerField(
        default=5, validators=[MaxValueValidator(100)], help_text="Retrieved experiences per build (top k)."
    )
    memory_max_chars = models.PositiveIntegerField(
        default=2000,
        validators=[MaxValueValidator(1_000_000)],
        help_text="Characters of retrieved experiences, in total.",
    )
    near_limit = models.FloatField(
        default=0.9,
        validators=[MinValueValidator(0.1), MaxValueValidator(1.0)],
        help_text="Warn when the prompt uses this share of its budget (input limit - reserve).",
    )
    middle_start = models.FloatField(
        default=0.30, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    middle_end = models.FloatField(default=0.70, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    mode = models.CharField(max_length=16, choices=ContextMode.choices, default=ContextMode.AGENT)
    mode_parts = models.JSONField(
        default=default_mode_parts,
        blank=True,
        help_text='Per mode: {"system_parts": [names or "*"], "tools": bool}.',
    )
    summary_max_tokens = models.PositiveIntegerField(
        default=800,
        validators=[MinValueValidator(50), MaxValueValidator(100_000)],
        help_text="Longest rolling summary (tokens).",
    )
    user_profile_share = models.FloatField(
        default=0.10,
        validators=[MinValueValidator(0.0), MaxValueValidator(0.5)],
        help_text="Share of the budget (input limit - reserve) the session user's memories may use; "
        "0 leaves them out.",
    )
    user_profile_max_tokens = models.PositiveIntegerField(
        default=1000,
        validators=[MaxValueValidator(100_000)],
        help_text="Most tokens of the user's memories, whatever the share gives.",
    )
    default_model = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Used when neither request nor session names a model.",
    )

    class Meta:
        verbose_name = "context policy"
        verbose_name_plural = "context policy"

    def __str__(self) -> str:
        return f"context policy of {self.tenant}"


class SessionContextPolicy(models.Model):
    """Per-session overrides of the tenant's ContextPolicy (only the keys present override)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="context_policy")
    overrides = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"context policy of session {self.session_id}"


class SummaryMethod(models.TextChoices):
    OFFLINE = "offline"
    LLM = "llm"
    LLM_FALLBACK = "llm_fallback"  # the endpoint failed; the offline summariser wrote it


class Summary(models.Model):
    """A session's rolling summary. One is current per session; earlier ones are kept as history."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    public_id = models.CharField(max_length=32, unique=True, default=new_summary_id, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="summaries")
    previous = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    is_current = models.BooleanField(default=True)
    text = models.TextField()
    tokens = models.PositiveIntegerField(default=0, help_text="o200k tokens of the text.")
    covers_up_to_seq = models.PositiveBigIntegerField(help_text="Every message with seq ≤ this is folded in.")
    folded_from_seq = models.PositiveBigIntegerField()
    folded_to_seq = models.PositiveBigIntegerField()
    folded_count = models.PositiveIntegerField()
    tokens_before = models.PositiveIntegerField(help_text="Previous summary + folded messages (o200k).")
    tokens_after = models.PositiveIntegerField()
    method = models.CharField(max_length=16, choices=SummaryMethod.choices, default=SummaryMethod.OFFLINE)
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(
                fields=["session"], condition=Q(is_current=True), name="summary_one_current_per_session"
            )
        ]
        indexes: ClassVar = [
            models.Index(fields=["session", "-covers_up_to_seq"], name="summary_session_covers")
        ]
        verbose_name_plural = "summaries"

    def __str__(self) -> str:
        return self.public_id


class BudgetSample(models.Model):
    """One context build: its budget by component and its manifest (what the dashboard plots)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    public_id = models.CharField(max_length=32, unique=True, default=new_build_id, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="budget_samples")
    created_at = models.DateTimeField(default=timezone.now)
    model_name = models.CharField(max_length=200)
    tokenizer = models.CharField(max_length=64)
    exact = models.BooleanField(default=True)
    prompt_tokens = models.PositiveIntegerField()
    demand_tokens = models.PositiveIntegerField(help_text="Tokens of everything considered, before fitting.")
    input_limit = models.PositiveIntegerField()
    output_reserve = models.PositiveIntegerField()
    threshold_tokens = models.PositiveIntegerField()
    utilisation = models.FloatField()
    components = models.JSONField(default=dict)
    manifest = models.JSONField(default=dict)
    warnings = models.JSONField(default=list)
    forecast = models.JSONField(default=dict)
    summarisation_queued = models.BooleanField(default=False)
    recalled_items = models.PositiveIntegerField(
        default=0, help_text="Recalled items (memory search hits, experiences) the prompt holds."
    )

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["session", "-created_at"], name="budgetsample_session_time")
        ]

    def __str__(self) -> str:
        return self.public_id


class TokenUsageReport(models.Model):
    """Provider-reported usage for a built context, against our estimate of it (calibration)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="usage_reports")
    budget_sample = models.ForeignKey(
        BudgetSample, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    model_name = models.CharField(max_length=200)
    tokenizer = models.CharField(max_length=64)
    estimated_input_tokens = models.PositiveIntegerField(help_text="Our count before any usage correction.")
    input_tokens = models.PositiveIntegerField(
        help_text="gen_ai.usage.input_tokens (all prompt tokens, cached included)."
    )
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_input_tokens = models.PositiveIntegerField(null=True, blank=True)
    reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes: ClassVar = [
            models.Index(fields=["tenant", "model_name", "-created_at"], name="usage_tenant_model_time")
        ]

    def __str__(self) -> str:
        return f"{self.model_name}: {self.estimated_input_tokens} estimated, {self.input_tokens} reported"

    @property
    def ratio(self) -> float:
        return self.input_tokens / self.estimated_input_tokens if self.estimated_input_tokens else 1.0
