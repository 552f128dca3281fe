"""The experience's shapes at the API edge: its one output serializer (list, detail, search hit,
bulk results, distillation) and its item input (a single create and each item of a bulk create).

Shared by memory/api/experiences.py (the views); imports no view.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from memory.api.base import BodySerializer, TenantApiView
from memory.exceptions import AgentMismatch
from memory.models import Experience, ExperienceKind, ExperienceScope
from memory.services import experiences


class ExperienceOutputSerializer(serializers.Serializer):
    id = serializers.CharField(source="public_id")
    problem = serializers.CharField()
    cause = serializers.CharField()
    solution = serializers.CharField()
    text = serializers.CharField()
    confidence = serializers.FloatField()
    extraction_method = serializers.CharField()
    kind = serializers.CharField()
    key = serializers.CharField()
    scope = serializers.CharField()
    user_id = serializers.CharField()
    agent = serializers.CharField(help_text="External id of the agent that recorded it; empty = none given.")
    aliases = serializers.SerializerMethodField(
        help_text="Texts of near-identical experiences merged into this one (found by full-text search)."
    )
    source_task = serializers.SerializerMethodField()
    source_session = serializers.SerializerMethodField()
    provenance = serializers.JSONField()
    embedding = serializers.SerializerMethodField()
    use_count = serializers.IntegerField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    helpful_count = serializers.IntegerField()
    unhelpful_count = serializers.IntegerField()
    merge_count = serializers.IntegerField()
    active = serializers.BooleanField(source="is_active")
    merged_into = serializers.SerializerMethodField()
    merged_at = serializers.DateTimeField(allow_null=True)
    superseded_by = serializers.SerializerMethodField()
    superseded_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def get_aliases(self, obj: Experience) -> list[str]:
        return [line for line in obj.aliases.splitlines() if line]

    def get_source_task(self, obj: Experience) -> str | None:
        return obj.source_task.public_id if obj.source_task_id else None  # type: ignore[union-attr]

    def get_source_session(self, obj: Experience) -> str | None:
        return obj.source_session.public_id if obj.source_session_id else None  # type: ignore[union-attr]

    def get_merged_into(self, obj: Experience) -> str | None:
        return obj.merged_into.public_id if obj.merged_into_id else None  # type: ignore[union-attr]

    def get_superseded_by(self, obj: Experience) -> str | None:
        return obj.superseded_by.public_id if obj.superseded_by_id else None  # type: ignore[union-attr]

    def get_embedding(self, obj: Experience) -> dict[str, Any]:
        return {
            "status": obj.embedding_status,
            "model": obj.embedding_model or None,
            "dimensions": obj.embedding_dimensions,
            "error": obj.embedding_error or None,
            "attempts": obj.embedding_attempts,
            "embedded_at": obj.embedded_at.isoformat() if obj.embedded_at else None,
        }


class ExperienceDetailSerializer(ExperienceOutputSerializer):
    merged_from = serializers.SerializerMethodField()
    supersedes = serializers.SerializerMethodField()

    def get_merged_from(self, obj: Experience) -> list[str]:
        return list(obj.merged_from.order_by("pk").values_list("public_id", flat=True))

    def get_supersedes(self, obj: Experience) -> list[str]:
        return list(obj.supersedes.order_by("pk").values_list("public_id", flat=True))


def agent_for_write(view: TenantApiView, requested: str) -> str:
    """The agent recorded on a new experience: a key bound to an agent always records that one."""
    bound = view.request.auth.agent_external_id  # type: ignore[union-attr]
    if bound and requested and requested != bound:
        raise AgentMismatch(
            f"This API key is bound to agent {bound!r}; it cannot record experiences as {requested!r}.",
            details={"bound_agent": bound, "requested_agent": requested},
        )
    return bound or requested


class ExperienceItemSerializer(BodySerializer):
    """One experience to create (single create and each item of a bulk create)."""

    class Meta:
        ref_name = "ExperienceItemInput"

    problem = serializers.CharField(max_length=10_000)
    cause = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    solution = serializers.CharField(max_length=20_000, required=False, allow_blank=True, default="")
    confidence = serializers.FloatField(min_value=0.0, max_value=1.0, required=False, default=0.5)
    user_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    scope = serializers.ChoiceField(choices=ExperienceScope.choices, required=False)
    kind = serializers.ChoiceField(choices=ExperienceKind.choices, required=False, default="experience")
    key = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    agent = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="External id of the agent recording it (a filter of list and search).",
    )
    merge = serializers.BooleanField(
        required=False,
        default=True,
        help_text="false: store a new row even when an identical experience exists; it never merges.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors = experiences.experience_input_errors(
            problem=attrs["problem"],
            confidence=attrs["confidence"],
            scope=attrs.get("scope"),
            user_id=attrs["user_id"],
        )
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class SearchHitSerializer(serializers.Serializer):
    experience = ExperienceOutputSerializer()
    score = serializers.FloatField()
    similarity = serializers.FloatField(allow_null=True, help_text="Blended cosine; null while pending.")
    text_score = serializers.FloatField(help_text="ts_rank / (ts_rank + 0.5).")
    contributions = serializers.DictField(
        child=serializers.FloatField(), help_text="Per source; sums to score."
    )

    class Meta:
        ref_name = "ExperienceSearchHit"
