"""Experiences API: list, create, read, search, feedback, promote, retry embeddings; task distill.

Routes (under /api/v1):
    GET  /experiences                       list (cursor pages; filters)
    POST /experiences                       create (pending; exact duplicates merge)
    POST /experiences/bulk                  create up to 1,000 at once (all or nothing)
    GET  /experiences/{id}                  one, with provenance, merge and supersede links
    DELETE /experiences/{id}                delete one (204)
    POST /experiences/search                hybrid search with a retrieval plan
    POST /experiences/{id}/feedback         helpful or not
    POST /experiences/promote               preference / project config / constraint → long-term
    POST /experiences/embeddings/retry      failed embeddings → pending, re-queued
    POST /tasks/{id}/distill                light (now) or full (queued) distillation
    GET/PATCH /tenant/policies/experiences  the tenant's experience policy: capacity, merge rule, … (admin)
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from memory.api.agent_scope import agent_filter_for_read, bound_agent
from memory.api.base import BodySerializer, CursorSerializer, KeysetPagination, TenantApiView
from memory.api.experience_serializers import (
    ExperienceDetailSerializer,
    ExperienceItemSerializer,
    ExperienceOutputSerializer,
    SearchHitSerializer,
    agent_for_write,
)
from memory.exceptions import InvalidInput
from memory.models import (
    ApiKeyScope,
    EmbeddingStatus,
    ExperienceKind,
    ExtractionMethod,
)
from memory.services import distillation, experiences
from memory.services import experience_search as retrieval
from memory.services.sessions import session_access, task_get


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
        agent = serializers.CharField(max_length=200, required=False, help_text="Only this agent's.")

    class InputSerializer(ExperienceItemSerializer):
        class Meta:
            ref_name = "ExperienceListInput"

        task = serializers.CharField(max_length=64, required=False, help_text="Source task id (provenance).")
        supersedes = serializers.CharField(
            max_length=64, required=False, help_text="Id of the experience this replaces."
        )

    class PageSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceListPage"

        items = ExperienceOutputSerializer(many=True)
        next = serializers.CharField(
            allow_null=True, help_text="Pass as `cursor` for the next page; null on the last page."
        )
        results = ExperienceOutputSerializer(many=True, help_text="Deprecated: the same list as `items`.")
        next_cursor = serializers.CharField(allow_null=True, help_text="Deprecated: `next`.")

    @extend_schema(
        parameters=[FilterSerializer],
        responses=PageSerializer,
        summary="List experiences",
        description="The list envelope `{items, next}`; `results` and `next_cursor` are deprecated "
        "aliases kept for older clients.",
    )
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
            agent=agent_filter_for_read(self, data.get("agent")),
            bound_agent=bound_agent(self),
        )
        pages = KeysetPagination()
        rows = pages.paginate_queryset(queryset, self.request, self)
        items = ExperienceOutputSerializer(rows, many=True).data
        return Response({**pages.get_paginated_response(items).data, "results": items})

    @extend_schema(
        request=InputSerializer,
        responses={201: ExperienceDetailSerializer, 200: ExperienceDetailSerializer},
        summary="Create an experience (an exact duplicate merges: 200, unless merge is false)",
    )
    def post(self, request: Request) -> Response:
        data = self.validate(self.InputSerializer)
        data["agent"] = agent_for_write(self, data["agent"])
        task = task_get(tenant=self.tenant, task_id=data.pop("task")) if data.get("task") else None
        supersedes_id = data.pop("supersedes", None)
        supersedes = (  # a bound key supersedes only its own agent's (404 otherwise, as a read)
            experiences.experience_get(
                tenant=self.tenant, experience_id=supersedes_id, bound_agent=bound_agent(self)
            )
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
        experience = experiences.experience_get(
            tenant=self.tenant, experience_id=experience_id, bound_agent=bound_agent(self)
        )
        return Response(ExperienceDetailSerializer(experience).data)

    @extend_schema(
        request=None,
        responses={204: None},
        summary="Delete an experience (its hidden merged duplicates too; what it superseded comes back)",
    )
    def delete(self, request: Request, experience_id: str) -> Response:
        experience = experiences.experience_get(
            tenant=self.tenant, experience_id=experience_id, bound_agent=bound_agent(self)
        )
        experiences.experience_delete(tenant=self.tenant, experience=experience)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ExperienceBulkApi(TenantApiView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "ExperienceBulkInput"

        items = serializers.ListField(
            child=serializers.JSONField(),  # each validated by ExperienceItemSerializer, all at once
            allow_empty=False,
            help_text="Up to CTXAPP_EXPERIENCES_BULK_MAX (1,000) experiences, each like POST /experiences.",
        )
        task = serializers.CharField(max_length=64, required=False, help_text="Source task of every item.")

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ExperienceBulkOutput"

        results = ExperienceOutputSerializer(many=True, help_text="One per item, in order, with `outcome`.")
        created = serializers.IntegerField()
        merged = serializers.IntegerField()
        unchanged = serializers.IntegerField()

    @extend_schema(
        request=InputSerializer,
        responses={201: OutputSerializer},
        summary="Create up to 1,000 experiences at once (all or nothing; embedded in batches)",
    )
    def post(self, request: Request) -> Response:
        data = self.validate(self.InputSerializer)
        raw = data["items"]
        limit = settings.CTXAPP.experiences_bulk_max
        if len(raw) > limit:
            raise InvalidInput(
                f"A bulk create holds at most {limit} experiences; got {len(raw)}. Split it.",
                details={"fields": {"items": [f"At most {limit} items per call."]}, "limit": limit},
            )
        # One list serializer (its child's fields are built once, not per item); every item's
        # errors are collected, named items[i].field, and nothing is written if any is bad.
        serializer = ExperienceItemSerializer(data=raw, many=True)
        errors: dict[str, Any] = {}
        if not serializer.is_valid():
            found = serializer.errors  # a list per item, or {index: errors} (DRF ≥ 3.15)
            by_index = found.items() if isinstance(found, dict) else enumerate(found)
            for index, item_errors in by_index:
                if not isinstance(item_errors, dict):
                    item_errors = {"non_field_errors": item_errors}
                errors.update({f"items[{index}].{name}": value for name, value in item_errors.items()})
        if errors:
            first = next(iter(errors))
            message = errors[first][0] if isinstance(errors[first], list) and errors[first] else "Invalid."
            raise InvalidInput(f"{first}: {message}", details={"fields": errors})
        items = [
            experiences.BulkItem(**{**item, "agent": agent_for_write(self, item["agent"])})
            for item in serializer.validated_data
        ]
        task = task_get(tenant=self.tenant, task_id=data["task"]) if data.get("task") else None
        results = experiences.experiences_create_bulk(tenant=self.tenant, items=items, source_task=task)
        counts = {"created": 0, "merged": 0, "unchanged": 0}
        rows = ExperienceOutputSerializer([r.experience for r in results], many=True).data
        body = []
        for result, row in zip(results, rows, strict=True):
            counts[result.outcome] += 1
            body.append({**row, "outcome": result.outcome})
        return Response({"results": body, **counts}, status=status.HTTP_201_CREATED)


class ExperiencePolicyApi(TenantApiView):
    """The tenant's experience policy. Admin scope, like the tenant's API keys."""

    required_scope = ApiKeyScope.ADMIN

    class PolicySerializer(BodySerializer):
        class Meta:
            ref_name = "ExperiencePolicy"

        capacity = serializers.IntegerField(
            min_value=1, max_value=100_000_000, help_text="Most experiences kept; LRU eviction beyond it."
        )
        merge_threshold = serializers.FloatField(
            min_value=0.0, max_value=1.0, help_text="Cosine at or above which near-identical texts merge."
        )
        merge_token_overlap = serializers.FloatField(
            min_value=0.0, max_value=1.0, help_text="Word-set overlap (Jaccard) a merge also needs."
        )
        supersede_problem_threshold = serializers.FloatField(min_value=0.0, max_value=1.0)
        solution_agreement_threshold = serializers.FloatField(min_value=0.0, max_value=1.0)
        vector_weight = serializers.FloatField(min_value=0.0, max_value=100.0)
        text_weight = serializers.FloatField(min_value=0.0, max_value=100.0)
        context_min_similarity = serializers.FloatField(min_value=-1.0, max_value=1.0)
        helpful_weight = serializers.FloatField(min_value=0.0, max_value=100.0)

    def _out(self, policy: Any) -> dict[str, Any]:
        return {name: getattr(policy, name) for name in experiences.POLICY_FIELDS}

    @extend_schema(responses=PolicySerializer, summary="The tenant's experience policy (admin scope)")
    def get(self, request: Request) -> Response:
        return Response(self._out(experiences.experience_policy_get(tenant=self.tenant)))

    @extend_schema(
        request=PolicySerializer(partial=True),
        responses=PolicySerializer,
        summary="Change the tenant's experience policy, e.g. its capacity (admin scope)",
    )
    def patch(self, request: Request) -> Response:
        if isinstance(request.data, dict):
            unknown = sorted(set(request.data) - set(experiences.POLICY_FIELDS))
            if unknown:
                raise InvalidInput(
                    f"Unknown policy field(s): {', '.join(unknown)}.",
                    details={"fields": {name: ["Unknown field."] for name in unknown}},
                )
        serializer = self.PolicySerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        policy = experiences.experience_policy_update(
            tenant=self.tenant, changes=dict(serializer.validated_data), actor=str(request.user)
        )
        return Response(self._out(policy))


class ExperienceSearchApi(TenantApiView):
    required_scope = "read"  # a POST that only reads

    class InputSerializer(BodySerializer):
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
        agent = serializers.CharField(max_length=200, required=False, help_text="Only this agent's.")

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
        data["agent"] = agent_filter_for_read(self, data.get("agent"))
        result = retrieval.experiences_search(tenant=self.tenant, **data)
        return Response(
            {
                "results": SearchHitSerializer(result.hits, many=True).data,
                "plan": result.plan,
                "warnings": result.warnings,
            }
        )


class ExperienceFeedbackApi(TenantApiView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "ExperienceFeedbackInput"

        helpful = serializers.BooleanField()
        note = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
        session = serializers.CharField(max_length=64, required=False)

    @extend_schema(request=InputSerializer, responses=ExperienceDetailSerializer, summary="Report an outcome")
    def post(self, request: Request, experience_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        experience = experiences.experience_get(
            tenant=self.tenant, experience_id=experience_id, bound_agent=bound_agent(self)
        )
        session = (
            session_access(tenant=self.tenant, session_id=data["session"]) if data.get("session") else None
        )
        experience = experiences.experience_feedback(
            tenant=self.tenant,
            experience=experience,
            helpful=data["helpful"],
            note=data["note"],
            session=session,
        )
        return Response(ExperienceDetailSerializer(experience).data)


class ExperiencePromoteApi(TenantApiView):
    class InputSerializer(BodySerializer):
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
        session = (
            session_access(tenant=self.tenant, session_id=data["session"]) if data.get("session") else None
        )
        result = experiences.experiences_promote(
            tenant=self.tenant,
            user_id=data["user_id"] or (session.user_id if session else ""),
            kind=data["kind"],
            key=data["key"],
            content=data["content"],
            source=data.get("source", "api"),
            session=session,
            agent=bound_agent(self) or "",
        )
        body = ExperienceDetailSerializer(result.experience).data
        body["outcome"] = result.outcome
        return Response(
            body, status=status.HTTP_201_CREATED if result.outcome == "created" else status.HTTP_200_OK
        )


class ExperienceRetryEmbeddingsApi(TenantApiView):
    class InputSerializer(BodySerializer):
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
            tenant=self.tenant, experience_ids=data.get("experiences"), bound_agent=bound_agent(self)
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
    class InputSerializer(BodySerializer):
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
    path("experiences/bulk", ExperienceBulkApi.as_view(), name="experiences-bulk"),
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
    path("tenant/policies/experiences", ExperiencePolicyApi.as_view(), name="tenant-policy-experiences"),
]
