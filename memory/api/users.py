"""User memory API: what is known about each user of the tenant, corrected and erased by version.

Routes (under /api/v1):
    GET    /users/{user_id}/memories                  current memories (or `as_of`), cursor pages
    POST   /users/{user_id}/memories                  record a value of a subject (supersedes)
    GET    /users/{user_id}/memories/{id}             one memory, current or not
    PATCH  /users/{user_id}/memories/{id}             correct it: a new version (409 if superseded)
    DELETE /users/{user_id}/memories/{id}             erase it and its earlier versions
    GET    /users/{user_id}/memories/{id}/history     every version of its subject, oldest first

A user is the `user_id` of the tenant's sessions: one no session or memory names answers 404, as
another tenant's does, and a key bound to an agent reaches only the users of its agent's sessions
and, of their memories, those memory/services/agent_access.py lets it read (its agent's own, plus
the others' read-only where the tenant shares user memories).
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from memory.api.agent_scope import bound_agent
from memory.api.base import BodySerializer, CursorSerializer, KeysetPagination, TenantApiView
from memory.models import EmbeddingStatus, UserMemoryOrigin, UserMemoryType
from memory.services.user_memory import memories
from memory.services.user_memory.store import MAX_SUBJECT_CHARS, MAX_TEXT_CHARS, Recorded

USER_PARAM = OpenApiParameter(
    "user_id",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="The user's id: the `user_id` the tenant puts on its sessions.",
)
MEMORY_PARAM = OpenApiParameter(
    "memory_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="The memory's id (`umem_…`)."
)


class UserMemorySourceSerializer(serializers.Serializer):
    session = serializers.CharField(help_text="The session the memory was taken from.")
    seq = serializers.IntegerField(help_text="The turn's seq in that session.")


class UserMemorySerializer(serializers.Serializer):
    class Meta:
        ref_name = "UserMemory"

    id = serializers.CharField(source="public_id")
    user_id = serializers.CharField()
    subject = serializers.CharField(help_text="What it is about; a new value of the subject supersedes it.")
    type = serializers.ChoiceField(source="memory_type", choices=UserMemoryType.choices)
    text = serializers.CharField()
    sources = UserMemorySourceSerializer(many=True, help_text="The conversation turns it came from.")
    confidence = serializers.FloatField()
    origin = serializers.ChoiceField(choices=UserMemoryOrigin.choices)
    agent = serializers.CharField(help_text="The agent whose session or key wrote it ('' for none).")
    current = serializers.BooleanField(source="is_current", help_text="True until a new value supersedes it.")
    valid_from = serializers.DateTimeField()
    valid_to = serializers.DateTimeField(allow_null=True)
    superseded_by = serializers.CharField(
        source="superseded_by.public_id",
        allow_null=True,
        default=None,
        help_text="The version that replaced it.",
    )
    embedding_status = serializers.ChoiceField(choices=EmbeddingStatus.choices)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class UserMemoryWrittenSerializer(UserMemorySerializer):
    class Meta:
        ref_name = "UserMemoryWritten"

    outcome = serializers.ChoiceField(
        choices=["created", "superseded", "unchanged"],
        help_text="`superseded`: an older value of the subject ended here (`supersedes`).",
    )
    supersedes = serializers.CharField(allow_null=True, help_text="The id of the version this one replaced.")


class UserMemoryPageSerializer(serializers.Serializer):
    class Meta:
        ref_name = "UserMemoryPage"

    items = UserMemorySerializer(many=True)
    next = serializers.CharField(
        allow_null=True, help_text="Pass as `cursor` for the next page; null on the last page."
    )
    next_cursor = serializers.CharField(allow_null=True, help_text="Deprecated: `next`.")


class UserMemoryHistorySerializer(serializers.Serializer):
    class Meta:
        ref_name = "UserMemoryHistory"

    items = UserMemorySerializer(many=True, help_text="Every version of the subject, oldest first.")


class UserMemoryDeletedSerializer(serializers.Serializer):
    class Meta:
        ref_name = "UserMemoryDeleted"

    deleted = serializers.ListField(
        child=serializers.CharField(), help_text="The erased ids: the memory and its earlier versions."
    )
    count = serializers.IntegerField()


def _text(**kwargs: Any) -> serializers.CharField:
    # Blank text is refused by the service (422 naming `text`), with the same message everywhere.
    return serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, trim_whitespace=False, **kwargs)


def _written(recorded: Recorded) -> dict[str, Any]:
    body = dict(UserMemorySerializer(recorded.memory).data)
    body["outcome"] = recorded.outcome
    body["supersedes"] = recorded.superseded.public_id if recorded.superseded is not None else None
    return body


class UserMemoriesView(TenantApiView):
    """The views of one user's memories: the user is checked first (404 for no such user)."""

    def scope(self, user_id: str) -> memories.UserScope:
        return memories.user_scope(tenant=self.tenant, user_id=user_id, bound_agent=bound_agent(self) or "")


class UserMemoryListApi(UserMemoriesView):
    schema_is_list = True

    class FilterSerializer(CursorSerializer):
        class Meta:
            ref_name = "UserMemoryListFilter"

        as_of = serializers.DateTimeField(
            required=False, help_text="ISO 8601 moment: the memories that were current then."
        )
        type = serializers.ChoiceField(choices=UserMemoryType.choices, required=False)

    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "UserMemoryInput"

        subject = serializers.CharField(
            max_length=MAX_SUBJECT_CHARS,
            help_text="What it is about (e.g. `home.city`); a current memory of the subject is superseded.",
        )
        text = _text(help_text="The memory, in words (non-empty).")
        type = serializers.ChoiceField(choices=UserMemoryType.choices, default=UserMemoryType.FACT)
        confidence = serializers.FloatField(default=1.0, min_value=0.0, max_value=1.0)

    @extend_schema(
        parameters=[USER_PARAM, FilterSerializer],
        responses=UserMemoryPageSerializer,
        summary="List a user's current memories (or those current at `as_of`)",
        description="Newest first, in the list envelope `{items, next}`. 404 for a user none of the "
        "tenant's sessions or memories names (and, for a key bound to an agent, for a user of no "
        "session of that agent).",
    )
    def get(self, request: Request, user_id: str) -> Response:
        data = self.validate_query(self.FilterSerializer)
        queryset = memories.user_memories_list(
            scope=self.scope(user_id), as_of=data.get("as_of"), memory_type=data.get("type")
        )
        pages = KeysetPagination()
        rows = pages.paginate_queryset(queryset, request, self)
        return pages.get_paginated_response(UserMemorySerializer(rows, many=True).data)

    @extend_schema(
        parameters=[USER_PARAM],
        request=InputSerializer,
        responses={201: UserMemoryWrittenSerializer, 200: UserMemoryWrittenSerializer},
        summary="Record a memory about the user (a new value of its subject supersedes the current one)",
        description="201 `created` or `superseded`; 200 `unchanged` when the subject already holds this "
        "text (ignoring case and spacing). The memory is embedded in the background.",
    )
    def post(self, request: Request, user_id: str) -> Response:
        scope = self.scope(user_id)
        data = self.validate(self.InputSerializer)
        recorded = memories.user_memory_create(
            scope=scope,
            subject=data["subject"],
            text=data["text"],
            memory_type=data["type"],
            confidence=data["confidence"],
        )
        code = status.HTTP_200_OK if recorded.outcome == "unchanged" else status.HTTP_201_CREATED
        return Response(_written(recorded), status=code)


class UserMemoryDetailApi(UserMemoriesView):
    class PatchSerializer(BodySerializer):
        class Meta:
            ref_name = "UserMemoryPatch"

        text = _text(required=False, help_text="The corrected text (non-empty).")
        type = serializers.ChoiceField(choices=UserMemoryType.choices, required=False)
        confidence = serializers.FloatField(required=False, min_value=0.0, max_value=1.0)

    @extend_schema(
        parameters=[USER_PARAM, MEMORY_PARAM],
        responses=UserMemorySerializer,
        summary="Read one memory of the user, current or not",
    )
    def get(self, request: Request, user_id: str, memory_id: str) -> Response:
        memory = memories.user_memory_get(scope=self.scope(user_id), memory_id=memory_id)
        return Response(UserMemorySerializer(memory).data)

    @extend_schema(
        parameters=[USER_PARAM, MEMORY_PARAM],
        request=PatchSerializer,
        responses={201: UserMemoryWrittenSerializer, 200: UserMemoryWrittenSerializer},
        summary="Correct a current memory: a new version of its subject supersedes it",
        description="201 `superseded` with the new version (its own id; the old one keeps its text and "
        "gets `valid_to`); 200 `unchanged` when nothing differs. 409 `memory_superseded` when the "
        "memory is no longer current (`details.superseded_by` names the newer one).",
    )
    def patch(self, request: Request, user_id: str, memory_id: str) -> Response:
        scope = self.scope(user_id)
        data = self.validate(self.PatchSerializer)
        recorded = memories.user_memory_update(
            scope=scope,
            memory_id=memory_id,
            text=data.get("text"),
            memory_type=data.get("type"),
            confidence=data.get("confidence"),
        )
        code = status.HTTP_200_OK if recorded.outcome == "unchanged" else status.HTTP_201_CREATED
        return Response(_written(recorded), status=code)

    @extend_schema(
        parameters=[USER_PARAM, MEMORY_PARAM],
        request=None,
        responses={200: UserMemoryDeletedSerializer},
        summary="Erase a memory and every earlier version of its subject",
        description="Later versions stay. The audit event holds ids only. A second delete answers 404.",
    )
    def delete(self, request: Request, user_id: str, memory_id: str) -> Response:
        deleted = memories.user_memory_delete(scope=self.scope(user_id), memory_id=memory_id)
        return Response({"deleted": deleted, "count": len(deleted)})


class UserMemoryHistoryApi(UserMemoriesView):
    @extend_schema(
        parameters=[USER_PARAM, MEMORY_PARAM],
        responses=UserMemoryHistorySerializer,
        summary="Every version of the memory's subject, oldest first",
        description="How the value changed: each version's `valid_from`, `valid_to` and `superseded_by`.",
    )
    def get(self, request: Request, user_id: str, memory_id: str) -> Response:
        versions = memories.user_memory_history(scope=self.scope(user_id), memory_id=memory_id)
        return Response({"items": UserMemorySerializer(versions, many=True).data})


urlpatterns = [
    path("users/<str:user_id>/memories", UserMemoryListApi.as_view(), name="api-user-memories"),
    path(
        "users/<str:user_id>/memories/<str:memory_id>",
        UserMemoryDetailApi.as_view(),
        name="api-user-memory",
    ),
    path(
        "users/<str:user_id>/memories/<str:memory_id>/history",
        UserMemoryHistoryApi.as_view(),
        name="api-user-memory-history",
    ),
]
