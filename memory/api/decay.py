"""Tracked facts, the decay report and compression of a session.

- `POST /api/v1/sessions/{id}/facts` register (or update by key) a fact
- `GET  /api/v1/sessions/{id}/facts` list them with their decay state; `?decayed=true` = the decay report
- `GET  /api/v1/sessions/{id}/facts/{fact_id}` one fact with its latest references
- `DELETE /api/v1/sessions/{id}/facts/{fact_id}` stop tracking it
- `POST /api/v1/sessions/{id}/facts/{fact_id}/reference` mark it referenced now
- `POST /api/v1/sessions/{id}/compress` the history compressed by priority (read-only on messages)
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from memory.api.base import (
    MAX_BIGINT,
    BodySerializer,
    CursorSerializer,
    TenantApiView,
    decode_cursor,
    encode_cursor,
)
from memory.models import DecayPolicy, FactImportance, FactScope
from memory.services import decay
from memory.services import history_compression as compression
from memory.services.sessions import session_access

FACT_TYPE_HELP = (
    "user_preference, constraint, goal, critical_info → high importance; decision, state, progress → medium; "
    "any other type (e.g. project_config, note) → low."
)


class FactOutputSerializer(serializers.Serializer):
    id = serializers.CharField(source="fact.public_id")
    key = serializers.CharField(source="fact.key")
    type = serializers.CharField(source="fact.fact_type")
    content = serializers.CharField(source="fact.content")
    importance = serializers.CharField(source="fact.importance")
    scope = serializers.CharField(source="fact.scope")
    source = serializers.CharField(source="fact.source")  # type: ignore[assignment]  # a field, not Field.source
    source_seq = serializers.IntegerField(source="fact.source_seq", allow_null=True)
    registered_round = serializers.IntegerField(source="fact.registered_round")
    last_referenced_round = serializers.IntegerField(source="fact.last_referenced_round")
    reference_count = serializers.IntegerField(source="fact.reference_count")
    last_injected_round = serializers.IntegerField(source="fact.last_injected_round", allow_null=True)
    last_injected_at = serializers.DateTimeField(source="fact.last_injected_at", allow_null=True)
    injection_count = serializers.IntegerField(source="fact.injection_count")
    round = serializers.IntegerField()
    threshold = serializers.IntegerField()
    rounds_since_reference = serializers.IntegerField()
    decayed = serializers.BooleanField()
    decayed_round = serializers.IntegerField(allow_null=True)
    decayed_at = serializers.DateTimeField(source="fact.decayed_at", allow_null=True)
    decay_count = serializers.IntegerField(source="fact.decay_count")
    recommendation = serializers.CharField()
    promoted_at = serializers.DateTimeField(source="fact.promoted_at", allow_null=True)
    created_at = serializers.DateTimeField(source="fact.created_at")
    updated_at = serializers.DateTimeField(source="fact.updated_at")


class ReferenceOutputSerializer(serializers.Serializer):
    round = serializers.IntegerField()
    method = serializers.CharField()
    message_seq = serializers.IntegerField(allow_null=True)
    score = serializers.FloatField(allow_null=True)
    created_at = serializers.DateTimeField()


def _status_of(tenant: Any, session: Any, fact: Any) -> decay.FactStatus:
    return decay.fact_status(
        fact=fact, policy=DecayPolicy.for_tenant(tenant), current_round=decay.session_round(session=session)
    )


class FactsApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "FactRegisterInput"

        key = serializers.CharField(
            max_length=200, help_text="Unique within the session; registering it again updates it."
        )
        type = serializers.RegexField(r"^[a-z][a-z0-9_]{0,63}$", max_length=64, help_text=FACT_TYPE_HELP)
        content = serializers.CharField(max_length=decay.MAX_FACT_CONTENT)
        scope = serializers.ChoiceField(choices=FactScope.choices, default=FactScope.SESSION)

    class ListQuerySerializer(CursorSerializer):
        class Meta:
            ref_name = "FactListQuery"

        decayed = serializers.BooleanField(required=False, allow_null=True, default=None)
        importance = serializers.ChoiceField(choices=FactImportance.choices, required=False)

    class ListOutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "FactList"

        session = serializers.CharField()
        round = serializers.IntegerField()
        items = FactOutputSerializer(many=True)
        next_cursor = serializers.CharField(allow_null=True)

    @extend_schema(
        request=InputSerializer,
        responses={201: FactOutputSerializer, 200: FactOutputSerializer},
        summary="Track a fact of the session (201), or update the one with this key (200)",
    )
    def post(self, request: Any, session_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        registration = decay.fact_register(
            tenant=self.tenant,
            session=session,
            key=data["key"],
            fact_type=data["type"],
            content=data["content"],
            scope=data["scope"],
        )
        body = FactOutputSerializer(_status_of(self.tenant, session, registration.fact)).data
        return Response(body, status=status.HTTP_201_CREATED if registration.created else status.HTTP_200_OK)

    @extend_schema(
        parameters=[ListQuerySerializer],
        responses=ListOutputSerializer,
        operation_id="session_facts_list",
        summary="The session's tracked facts with their decay state; ?decayed=true is the decay report",
    )
    def get(self, request: Any, session_id: str) -> Response:
        query = self.validate_query(self.ListQuerySerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        current, statuses = decay.facts_list(
            tenant=self.tenant,
            session=session,
            decayed=query.get("decayed"),
            importance=query.get("importance"),
        )
        # The report is small (facts of one session) and ordered by urgency, so the cursor is an offset.
        offset = decode_cursor(query["cursor"]) if query.get("cursor") else 0
        size = query.get("limit") or 100
        page = statuses[offset : offset + size]
        next_cursor = encode_cursor(offset + size) if offset + size < len(statuses) else None
        return Response(
            self.ListOutputSerializer(
                {"session": session.public_id, "round": current, "items": page, "next_cursor": next_cursor}
            ).data
        )


class FactApi(TenantApiView):
    class OutputSerializer(FactOutputSerializer):
        class Meta:
            ref_name = "FactDetail"

        references = ReferenceOutputSerializer(many=True)

    @extend_schema(
        responses=OutputSerializer,
        operation_id="session_fact_get",
        summary="One tracked fact with its latest references",
    )
    def get(self, request: Any, session_id: str, fact_id: str) -> Response:
        session = session_access(tenant=self.tenant, session_id=session_id)
        fact = decay.fact_get(tenant=self.tenant, session=session, fact_id=fact_id)
        fact_state = _status_of(self.tenant, session, fact)
        data = self.OutputSerializer(
            {**fact_state.__dict__, "references": decay.fact_references(fact=fact)}
        ).data
        return Response(data)

    @extend_schema(responses={204: None}, summary="Stop tracking a fact")
    def delete(self, request: Any, session_id: str, fact_id: str) -> Response:
        session = session_access(tenant=self.tenant, session_id=session_id)
        fact = decay.fact_get(tenant=self.tenant, session=session, fact_id=fact_id)
        decay.fact_delete(tenant=self.tenant, session=session, fact=fact)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FactReferenceApi(TenantApiView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "FactReferenceInput"

        note = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

    @extend_schema(
        request=InputSerializer,
        responses=FactOutputSerializer,
        summary="Mark a fact referenced in the current round (clears its decay)",
    )
    def post(self, request: Any, session_id: str, fact_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        fact = decay.fact_get(tenant=self.tenant, session=session, fact_id=fact_id)
        fact = decay.fact_reference(tenant=self.tenant, session=session, fact=fact, note=data["note"])
        return Response(FactOutputSerializer(_status_of(self.tenant, session, fact)).data)


class CompressedMessageSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    role = serializers.CharField()
    content = serializers.CharField(allow_blank=True)
    category = serializers.CharField()
    priority = serializers.IntegerField()
    tokens = serializers.IntegerField(source="kept_tokens")
    original_tokens = serializers.IntegerField(source="tokens")
    truncated = serializers.BooleanField()
    event_kind = serializers.CharField(allow_blank=True)


class DroppedMessageSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    role = serializers.CharField()
    category = serializers.CharField()
    priority = serializers.IntegerField()
    tokens = serializers.IntegerField()
    event_kind = serializers.CharField(allow_blank=True)


class SessionCompressApi(TenantApiView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "CompressInput"

        target_ratio = serializers.FloatField(
            required=False,
            min_value=0.01,
            max_value=1.0,
            help_text="Tokens after / tokens before; default 0.3.",
        )
        up_to_seq = serializers.IntegerField(required=False, min_value=1, max_value=MAX_BIGINT)
        recent_messages = serializers.IntegerField(required=False, min_value=0, max_value=10_000)
        allow_truncation = serializers.BooleanField(required=False, default=True)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "CompressedHistory"

        session = serializers.CharField(source="session.public_id")
        target_ratio = serializers.FloatField()
        ratio = serializers.FloatField()
        target_met = serializers.BooleanField()
        tokens_before = serializers.IntegerField()
        tokens_after = serializers.IntegerField()
        messages = CompressedMessageSerializer(many=True, source="kept")
        dropped = DroppedMessageSerializer(many=True)

    @extend_schema(
        request=InputSerializer,
        responses=OutputSerializer,
        summary="The session's history compressed by priority to a target ratio (messages are not changed)",
    )
    def post(self, request: Any, session_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        result = compression.session_compress(tenant=self.tenant, session=session, **data)
        return Response(self.OutputSerializer(result).data)


urlpatterns = [
    path("sessions/<str:session_id>/facts", FactsApi.as_view(), name="api-session-facts"),
    path("sessions/<str:session_id>/facts/<str:fact_id>", FactApi.as_view(), name="api-session-fact"),
    path(
        "sessions/<str:session_id>/facts/<str:fact_id>/reference",
        FactReferenceApi.as_view(),
        name="api-session-fact-reference",
    ),
    path("sessions/<str:session_id>/compress", SessionCompressApi.as_view(), name="api-session-compress"),
]
