"""Experiences API: list, create, read, search, feedback, promote, retry embeddings; task distill.

Routes (under /api/v1):
    GET  /experiences                       list (cursor pages; filters)
    POST /experiences                       create (pending; exact duplicates merge)
    GET  /experiences/{id}                  one, with provenance, merge and supersede links
    POST /experiences/search                hybrid search with a retrieval plan
    POST /experiences/{id}/feedback         helpful or not
    POST /experiences/promote               preference / project config / constraint → long-term
    POST /experiences/embeddings/retry      failed embeddings → pending, re-queued
    POST /tasks/{id}/distill                light (now) or full (queued) distillation
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from memory.api.base import CursorSerializer, TenantApiView, keyset_page
from memory.models import EmbeddingStatus, Experience, ExperienceKind, ExperienceScope, ExtractionMethod
from memory.services import distillation, experiences, retrieval
from memory.services.sessions import session_get, task_get


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


class ExperienceListApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    class FilterSerializer(CursorSerializer):
        class Meta:
            ref_name = "ExperienceListFilter"

        user_id = serializers.CharField(required=False)
        kind = serializers.ChoiceField(choices=ExperienceKind.choices, required=False)
        embedding_status = serializers.ChoiceField(choices=EmbeddingStatus.choices, required=False)
        extraction_method = serializers.ChoiceField(choices=ExtractionMethod.choices, required=False)
        include_superseded = serializers.BooleanField(required=False, default=False)
        as_of = serializers.DateTimeField(required=False)

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceListInput"

        problem = serializers.CharField(max_length=10_000)
        cause = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
        solution = serializers.CharField(max_length=20_000, required=False, allow_blank=True, default="")
        confidence = serializers.FloatField(min_value=0.0, max_value=1.0, required=False, default=0.5)
        user_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
        scope = serializers.ChoiceField(choices=ExperienceScope.choices, required=False)
        kind = serializers.ChoiceField(choices=ExperienceKind.choices, required=False, default="experience")
        key = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
        task = serializers.CharField(max_length=64, required=False, help_text="Source task id (provenance).")
        supersedes = serializers.CharField(
            max_length=64, required=False, help_text="Id of the experience this replaces."
        )

    class PageSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceListPage"

        results = ExperienceOutputSerializer(many=True)
        next_cursor = serializers.CharField(allow_null=True)

    @extend_schema(parameters=[FilterSerializer], responses=PageSerializer, summary="List experiences")
    def get(self, request: Request) -> Response:
        data = self.validate_query(self.FilterSerializer)
        queryset = experiences.experiences_list(
            tenant=self.tenant,
            user_id=data.get("user_id"),
            kind=data.get("kind"),
            embedding_status=data.get("embedding_status"),
            extraction_method=data.get("extraction_method"),
            include_superseded=data["include_superseded"],
            as_of=data.get("as_of"),
        )
        rows, next_cursor = keyset_page(queryset, cursor=data.get("cursor"), limit=data.get("limit"))
        return Response(
            {"results": ExperienceOutputSerializer(rows, many=True).data, "next_cursor": next_cursor}
        )

    @extend_schema(
        request=InputSerializer,
        responses={201: ExperienceDetailSerializer, 200: ExperienceDetailSerializer},
        summary="Create an experience (an exact duplicate merges: 200)",
    )
    def post(self, request: Request) -> Response:
        data = self.validate(self.InputSerializer)
        task = task_get(tenant=self.tenant, task_id=data.pop("task")) if data.get("task") else None
        supersedes_id = data.pop("supersedes", None)
        supersedes = (
            experiences.experience_get(tenant=self.tenant, experience_id=supersedes_id)
            if supersedes_id
            else None
        )
        result = experiences.experience_create(
            tenant=self.tenant,
            extraction_method=ExtractionMethod.MANUAL,
            source_task=task,
            supersedes=supersedes,
            **data,
        )
        body = ExperienceDetailSerializer(result.experience).data
        body["outcome"] = result.outcome
        return Response(
            body, status=status.HTTP_201_CREATED if result.outcome == "created" else status.HTTP_200_OK
        )


class ExperienceDetailApi(TenantApiView):
    @extend_schema(responses=ExperienceDetailSerializer, summary="Read one experience with its links")
    def get(self, request: Request, experience_id: str) -> Response:
        experience = experiences.experience_get(tenant=self.tenant, experience_id=experience_id)
        return Response(ExperienceDetailSerializer(experience).data)


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


class ExperienceSearchApi(TenantApiView):
    required_scope = "read"  # a POST that only reads

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceSearchInput"

        query = serializers.CharField(max_length=8192)
        user_id = serializers.CharField(max_length=200, required=False, allow_blank=True)
        limit = serializers.IntegerField(min_value=1, max_value=100, required=False, default=10)
        sources = serializers.ListField(child=serializers.CharField(), required=False, allow_empty=False)
        weights = serializers.DictField(child=serializers.FloatField(min_value=0.0), required=False)
        fusion = serializers.ChoiceField(choices=retrieval.FUSIONS, required=False)
        include_superseded = serializers.BooleanField(required=False, default=False)
        as_of = serializers.DateTimeField(required=False)
        kind = serializers.ChoiceField(choices=ExperienceKind.choices, required=False)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceSearchOutput"

        results = SearchHitSerializer(many=True)
        plan = serializers.DictField()
        warnings = serializers.ListField(child=serializers.CharField())

    @extend_schema(
        request=InputSerializer, responses=OutputSerializer, summary="Hybrid search of experiences"
    )
    def post(self, request: Request) -> Response:
        data = self.validate(self.InputSerializer)
        result = retrieval.experiences_search(tenant=self.tenant, **data)
        return Response(
            {
                "results": SearchHitSerializer(result.hits, many=True).data,
                "plan": result.plan,
                "warnings": result.warnings,
            }
        )


class ExperienceFeedbackApi(TenantApiView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceFeedbackInput"

        helpful = serializers.BooleanField()
        note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
        session = serializers.CharField(max_length=64, required=False)

    @extend_schema(request=InputSerializer, responses=ExperienceDetailSerializer, summary="Report an outcome")
    def post(self, request: Request, experience_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        experience = experiences.experience_get(tenant=self.tenant, experience_id=experience_id)
        session = session_get(tenant=self.tenant, session_id=data["session"]) if data.get("session") else None
        experience = experiences.experience_feedback(
            tenant=self.tenant,
            experience=experience,
            helpful=data["helpful"],
            note=data["note"],
            session=session,
        )
        return Response(ExperienceDetailSerializer(experience).data)


class ExperiencePromoteApi(TenantApiView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperiencePromoteInput"

        kind = serializers.ChoiceField(choices=sorted(experiences.PROMOTABLE_KINDS))
        key = serializers.CharField(max_length=200)
        content = serializers.CharField(max_length=10_000)
        user_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
        session = serializers.CharField(max_length=64, required=False)
        source = serializers.JSONField(required=False)  # type: ignore[assignment]

    @extend_schema(
        request=InputSerializer,
        responses={
            201: OpenApiResponse(ExperienceDetailSerializer, description="Created (`outcome: created`)."),
            200: OpenApiResponse(ExperienceDetailSerializer, description="An existing one updated or kept."),
        },
        summary="Promote a preference, project configuration or constraint to long-term memory",
    )
    def post(self, request: Request) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_get(tenant=self.tenant, session_id=data["session"]) if data.get("session") else None
        result = experiences.experiences_promote(
            tenant=self.tenant,
            user_id=data["user_id"] or (session.user_id if session else ""),
            kind=data["kind"],
            key=data["key"],
            content=data["content"],
            source=data.get("source", "api"),
            session=session,
        )
        body = ExperienceDetailSerializer(result.experience).data
        body["outcome"] = result.outcome
        return Response(
            body, status=status.HTTP_201_CREATED if result.outcome == "created" else status.HTTP_200_OK
        )


class ExperienceRetryEmbeddingsApi(TenantApiView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceRetryEmbeddingsInput"

        experiences = serializers.ListField(child=serializers.CharField(max_length=64), required=False)

    @extend_schema(
        request=InputSerializer,
        responses={202: inline_serializer("ExperienceRetryOutput", {"requeued": serializers.IntegerField()})},
        summary="Re-queue failed embeddings of this tenant",
    )
    def post(self, request: Request) -> Response:
        data = self.validate(self.InputSerializer)
        count = experiences.experiences_retry_failed(
            tenant=self.tenant, experience_ids=data.get("experiences")
        )
        return Response({"requeued": count}, status=status.HTTP_202_ACCEPTED)


TASK_DISTILL_OUTPUT = inline_serializer(
    "TaskDistillOutput",
    {
        "task": serializers.CharField(),
        "mode": serializers.CharField(),
        "status": serializers.CharField(),
        "experiences": serializers.ListField(child=serializers.DictField()),
    },
)


class TaskDistillApi(TenantApiView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TaskDistillInput"

        mode = serializers.ChoiceField(choices=distillation.MODES, required=False, default="full")

    @extend_schema(
        request=InputSerializer,
        responses={
            200: OpenApiResponse(TASK_DISTILL_OUTPUT, description="Light mode: distilled now."),
            202: OpenApiResponse(TASK_DISTILL_OUTPUT, description="Full mode: queued (`status: queued`)."),
        },
        summary="Distil a finished task (light: now, full: queued)",
    )
    def post(self, request: Request, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task = task_get(tenant=self.tenant, task_id=task_id)
        result = distillation.task_distill(tenant=self.tenant, task=task, mode=data["mode"])
        body = {
            "task": task.public_id,
            "mode": result.mode,
            "status": "queued" if result.queued else "done",
            "experiences": [
                {**ExperienceOutputSerializer(item.experience).data, "outcome": item.outcome}
                for item in result.results
            ],
        }
        return Response(body, status=status.HTTP_202_ACCEPTED if result.queued else status.HTTP_200_OK)


urlpatterns = [
    path("experiences", ExperienceListApi.as_view(), name="experiences"),
    path("experiences/search", ExperienceSearchApi.as_view(), name="experiences-search"),
    path("experiences/promote", ExperiencePromoteApi.as_view(), name="experiences-promote"),
    path("experiences/embeddings/retry", ExperienceRetryEmbeddingsApi.as_view(), name="experiences-retry"),
    path("experiences/<str:experience_id>", ExperienceDetailApi.as_view(), name="experience"),
    path(
        "experiences/<str:experience_id>/feedback",
        ExperienceFeedbackApi.as_view(),
        name="experience-feedback",
    ),
    path("tasks/<str:task_id>/distill", TaskDistillApi.as_view(), name="task-distill"),
]
