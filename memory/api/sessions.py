"""The agent API: sessions, messages, tasks and the flight recorder's events (DESIGN.md §7).

Views are adapters: validate, call one service (memory.services.sessions / recorder), shape
the output. Every lookup is by the caller's tenant, so another tenant's id answers 404 exactly
like a missing one. Writes accept an Idempotency-Key (TenantApiView).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_serializer,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import agent_filter_for_read
from memory.api.base import (
    MAX_BIGINT,
    BodySerializer,
    CursorSerializer,
    KeysetPagination,
    SeqPagination,
    TenantApiView,
    keyset_response,
    page_serializer,
)
from memory.api.message_inputs import MessageInputSerializer, message_inputs_validate
from memory.api.shapes import (
    EventOutputSerializer,
    MessageOutputSerializer,
    SessionOutputSerializer,
    TaskOutputSerializer,
    event_out,
    session_out,
    task_out,
)
from memory.models import SessionStatus, TaskStatus, ValueTier
from memory.selectors import sessions as selectors
from memory.services import recorder
from memory.services import sessions as svc

SessionPageSerializer = page_serializer("SessionPage", SessionOutputSerializer(many=True), KeysetPagination)
TaskPageSerializer = page_serializer("TaskPage", TaskOutputSerializer(many=True), KeysetPagination)
# One bound output serializer for the append's answer: building one per request deep-copies its
# declared fields (≈ 0.5 ms); representing keeps no per-call state on it, so sharing is safe.
_APPENDED_OUT = MessageOutputSerializer()
MessagePageSerializer = page_serializer("MessagePage", MessageOutputSerializer(many=True), SeqPagination)
EventPageSerializer = page_serializer("EventPage", EventOutputSerializer(many=True), SeqPagination)
BatchOutputSerializer = inline_serializer(
    "MessageBatchAppended",
    {
        "session": serializers.CharField(),
        "first_seq": serializers.IntegerField(),
        "last_seq": serializers.IntegerField(),
        "messages": inline_serializer(
            "AppendedMessage",
            {"seq": serializers.IntegerField(), "token_count": serializers.IntegerField()},
            many=True,
        ),
    },
)


def list_filters(data: dict[str, Any]) -> dict[str, Any]:
    """A list's validated filters without its paging parameters (the pagination reads those)."""
    return {key: value for key, value in data.items() if key not in CursorSerializer().fields}


class AfterSerializer(serializers.Serializer):
    after = serializers.IntegerField(required=False, min_value=0, max_value=MAX_BIGINT, default=0)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000)


# --- sessions ----------------------------------------------------------------------------------


class SessionListCreateApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema_serializer(component_name="SessionCreate")
    class InputSerializer(BodySerializer):
        agent = serializers.CharField(
            max_length=200, help_text="The agent's external id; created on first use."
        )
        key = serializers.CharField(
            max_length=200,
            required=False,
            trim_whitespace=False,
            help_text="The application's own id of the conversation, unique per agent. A repeat with "
            "a key the agent already has answers 200 with that session, unchanged.",
        )
        user_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
        model = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
        metadata = serializers.DictField(
            required=False, default=dict, help_text="Any JSON object up to CTXAPP_MAX_JSON_FIELD_BYTES."
        )
        ttl_seconds = serializers.IntegerField(
            required=False,
            min_value=60,
            max_value=90 * 24 * 3600,
            help_text="Idle TTL (default: tenant policy, 24 h).",
        )

    @extend_schema_serializer(component_name="SessionFilter")
    class FilterSerializer(CursorSerializer):
        agent = serializers.CharField(required=False, source="agent_external_id")
        user_id = serializers.CharField(required=False)
        status = serializers.ChoiceField(choices=SessionStatus.choices, required=False)

    @extend_schema(
        request=InputSerializer,
        responses={201: SessionOutputSerializer, 200: SessionOutputSerializer},
        summary="Open a session for an agent",
        description="201 and `session.created`; evicts the agent's least recently used open sessions "
        "beyond the tenant's live-session limit (100). With a `key` the agent already has: 200 and "
        "that session as it is (any status), nothing written, so a repeat is idempotent.",
    )
    def post(self, request: Any) -> Response:
        data = self.validate(self.InputSerializer)
        ttl = timedelta(seconds=data["ttl_seconds"]) if data.get("ttl_seconds") else None
        session, created = svc.session_open(
            tenant=self.tenant,
            agent_external_id=data["agent"],
            key=data.get("key"),
            user_id=data["user_id"],
            model_name=data["model"],
            metadata=data["metadata"],
            ttl=ttl,
        )
        return Response(session_out(session), status=201 if created else 200)

    @extend_schema(
        parameters=[FilterSerializer],
        responses=SessionPageSerializer,
        summary="List sessions, newest first (filter by agent, user, status)",
    )
    def get(self, request: Any) -> Response:
        filters = list_filters(self.validate_query(self.FilterSerializer))
        filters["agent_external_id"] = agent_filter_for_read(self, filters.get("agent_external_id"))
        queryset = selectors.sessions_list(tenant=self.tenant, **filters)
        return keyset_response(self, queryset, SessionOutputSerializer)


class SessionDetailApi(TenantApiView):
    @extend_schema(responses=SessionOutputSerializer, summary="Read a session (keeps it alive)")
    def get(self, request: Any, session_id: str) -> Response:
        return Response(session_out(svc.session_access(tenant=self.tenant, session_id=session_id)))

    @extend_schema(
        responses={204: None},
        summary="Delete a session and its messages",
        description="Its events stay (the audit trail); records `session.deleted`.",
    )
    def delete(self, request: Any, session_id: str) -> Response:
        session = selectors.session_get(tenant=self.tenant, session_id=session_id)
        svc.session_delete(tenant=self.tenant, session=session)
        return Response(status=204)


class SessionEndApi(TenantApiView):
    @extend_schema(
        request=None,
        responses=SessionOutputSerializer,
        summary="End a session",
        description="Promotes its important facts to long-term memory and records `session.ended`. "
        "Ending a session that is no longer open changes nothing.",
    )
    def post(self, request: Any, session_id: str) -> Response:
        session = selectors.session_get(tenant=self.tenant, session_id=session_id)
        return Response(session_out(svc.session_end(tenant=self.tenant, session=session)))


class SessionMessagesApi(TenantApiView):
    idempotent_optimistic = True  # the append hot path: one statement for its Idempotency-Key
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema(
        request=MessageInputSerializer,
        responses={201: MessageOutputSerializer, 200: BatchOutputSerializer},
        summary='Append one message, or a batch: {"messages": [...]} (all or nothing)',
        description="A batch holds up to CTXAPP_BATCH_MAX_MESSAGES (1,000) messages and answers "
        "`{session, first_seq, last_seq, messages: [{seq, token_count}]}`. Seqs are gapless per session. "
        "Bad fields → 422 naming them (`messages[3].role`); ended session → 409 `session_ended`.",
    )
    def post(self, request: Any, session_id: str) -> Response:
        items, is_batch = message_inputs_validate(request.data)
        # The session is read (tenant-scoped) in the append's own statement.
        messages = svc.messages_append(tenant=self.tenant, session_id=session_id, items=items)
        if not is_batch:
            return Response(_APPENDED_OUT.to_representation(messages[0]), status=201)
        return Response(
            {
                "session": session_id,
                "first_seq": messages[0].seq,
                "last_seq": messages[-1].seq,
                "messages": [{"seq": m.seq, "token_count": m.token_count} for m in messages],
            },
            status=201,
        )

    @extend_schema(
        parameters=[AfterSerializer],
        responses=MessagePageSerializer,
        summary="List messages with seq > after, oldest first",
    )
    def get(self, request: Any, session_id: str) -> Response:
        data = self.validate_query(AfterSerializer)
        limit = data.get("limit") or settings.CTXAPP.page_size
        session = svc.session_access(tenant=self.tenant, session_id=session_id)
        pages = SeqPagination()
        rows = pages.paginate_rows(
            selectors.messages_after(
                tenant=self.tenant, session=session, after_seq=data["after"], limit=limit + 1
            ),
            limit,
        )
        return pages.get_paginated_response(MessageOutputSerializer(rows, many=True).data)


class AgentLatestSessionApi(TenantApiView):
    @extend_schema(
        responses=SessionOutputSerializer,
        summary="The agent's most recently created session",
        description="404 `no_session` when the agent has none; 404 `not_found` for an unknown agent.",
    )
    def get(self, request: Any, agent: str) -> Response:
        return Response(session_out(selectors.session_latest(tenant=self.tenant, agent_external_id=agent)))


# --- tasks -------------------------------------------------------------------------------------


class TaskCreateApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema_serializer(component_name="TaskCreate")
    class InputSerializer(BodySerializer):
        session = serializers.CharField(required=False, help_text="The session the task runs in.")
        agent = serializers.CharField(
            required=False, max_length=200, help_text="Default: the session's agent."
        )
        user_id = serializers.CharField(required=False, max_length=200, allow_blank=True, default="")
        title = serializers.CharField(required=False, max_length=500, allow_blank=True, default="")
        input = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False, default="")
        value_tier = serializers.ChoiceField(
            choices=ValueTier.choices, required=False, default=ValueTier.NORMAL
        )
        metadata = serializers.DictField(required=False, default=dict)

    @extend_schema_serializer(component_name="TaskFilter")
    class FilterSerializer(CursorSerializer):
        session = serializers.CharField(required=False, source="session_id")
        agent = serializers.CharField(required=False, source="agent_external_id")
        user_id = serializers.CharField(required=False)
        status = serializers.ChoiceField(choices=TaskStatus.choices, required=False)

    @extend_schema(
        parameters=[FilterSerializer],
        responses=TaskPageSerializer,
        summary="List tasks, newest first (filter by session, agent, user, status)",
    )
    def get(self, request: Any) -> Response:
        filters = list_filters(self.validate_query(self.FilterSerializer))
        filters["agent_external_id"] = agent_filter_for_read(self, filters.get("agent_external_id"))
        queryset = selectors.tasks_list(tenant=self.tenant, **filters)
        return keyset_response(self, queryset, TaskOutputSerializer)

    @extend_schema(request=InputSerializer, responses={201: TaskOutputSerializer}, summary="Record a task")
    def post(self, request: Any) -> Response:
        data = self.validate(self.InputSerializer)
        session = None
        if data.get("session"):
            session = selectors.session_get(tenant=self.tenant, session_id=data["session"])
        task = svc.task_create(
            tenant=self.tenant,
            session=session,
            agent_external_id=data.get("agent"),
            user_id=data["user_id"],
            title=data["title"],
            input=data["input"],
            value_tier=data["value_tier"],
            metadata=data["metadata"],
        )
        return Response(task_out(task), status=201)


class TaskDetailApi(TenantApiView):
    @extend_schema_serializer(component_name="TaskUpdate")
    class InputSerializer(BodySerializer):
        status = serializers.ChoiceField(choices=TaskStatus.choices, required=False)
        output = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
        metadata = serializers.DictField(required=False, help_text="Merged into the task's metadata.")

    @extend_schema(responses=TaskOutputSerializer, summary="Read a task")
    def get(self, request: Any, task_id: str) -> Response:
        return Response(task_out(selectors.task_get(tenant=self.tenant, task_id=task_id)))

    @extend_schema(
        request=InputSerializer,
        responses=TaskOutputSerializer,
        summary="Update a task's status, output or metadata",
        description="pending → running → succeeded | failed. Finishing records `task.completed` and "
        "hands the task to distillation; a finished task is final (409 `task_finished`).",
    )
    def patch(self, request: Any, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task = selectors.task_get(tenant=self.tenant, task_id=task_id)
        task = svc.task_update(tenant=self.tenant, task=task, **data)
        return Response(task_out(task))


# --- events (flight recorder) --------------------------------------------------------------------


class AgentEventsApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema_serializer(component_name="AgentEventCreate")
    class InputSerializer(BodySerializer):
        json_unbounded_fields = frozenset({"payload"})  # CTXAPP_EVENT_PAYLOAD_MAX_BYTES (413)
        type = serializers.CharField(
            max_length=100, help_text="Must start with `agent.` (e.g. `agent.tool.called`)."
        )
        payload = serializers.DictField(required=False, default=dict)
        session = serializers.CharField(
            required=False, help_text="A session of this agent the event belongs to."
        )

    @extend_schema_serializer(component_name="EventFilter")
    class FilterSerializer(AfterSerializer):
        type = serializers.CharField(
            required=False, help_text="Comma-separated types; `agent.*` matches a prefix."
        )
        session = serializers.CharField(required=False, help_text="Only the events of this session.")

    @extend_schema(
        parameters=[FilterSerializer],
        responses=EventPageSerializer,
        summary="The agent's events with seq > after, oldest first",
    )
    def get(self, request: Any, agent: str) -> Response:
        data = self.validate_query(self.FilterSerializer)
        limit = data.get("limit") or settings.CTXAPP.page_size
        agent_row = selectors.agent_get(tenant=self.tenant, external_id=agent)
        types = [t.strip() for t in data.get("type", "").split(",") if t.strip()] or None
        session = None
        if data.get("session"):
            session = selectors.session_get(tenant=self.tenant, session_id=data["session"])
        pages = SeqPagination()
        rows = pages.paginate_rows(
            recorder.events_list(
                tenant=self.tenant,
                agent=agent_row,
                after_seq=data["after"],
                limit=limit + 1,
                types=types,
                session=session,
            ),
            limit,
        )
        return pages.get_paginated_response(EventOutputSerializer(rows, many=True).data)

    @extend_schema(
        request=InputSerializer,
        responses={201: EventOutputSerializer},
        parameters=[OpenApiParameter("agent", OpenApiTypes.STR, OpenApiParameter.PATH)],
        summary="Record an event the agent emits (type `agent.*`, payload ≤ 256 KiB)",
        description="422 naming `type` for another prefix; 413 naming `payload` when it is too large.",
    )
    def post(self, request: Any, agent: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = None
        if data.get("session"):
            session = selectors.session_get(tenant=self.tenant, session_id=data["session"])
        with transaction.atomic():  # a refused event must not leave a new agent behind
            agent_row = svc.agent_get_or_create(tenant=self.tenant, external_id=agent)
            event = recorder.event_emit(
                tenant=self.tenant,
                agent=agent_row,
                type=data["type"],
                payload=data["payload"],
                session=session,
            )
        return Response(event_out(event), status=201)


urlpatterns = [
    path("sessions", SessionListCreateApi.as_view(), name="api-sessions"),
    path("sessions/<str:session_id>", SessionDetailApi.as_view(), name="api-session"),
    path("sessions/<str:session_id>/end", SessionEndApi.as_view(), name="api-session-end"),
    path("sessions/<str:session_id>/messages", SessionMessagesApi.as_view(), name="api-session-messages"),
    path(
        "agents/<str:agent>/latest-session", AgentLatestSessionApi.as_view(), name="api-agent-latest-session"
    ),
    path("agents/<str:agent>/events", AgentEventsApi.as_view(), name="api-agent-events"),
    path("tasks", TaskCreateApi.as_view(), name="api-tasks"),
    path("tasks/<str:task_id>", TaskDetailApi.as_view(), name="api-task"),
]
