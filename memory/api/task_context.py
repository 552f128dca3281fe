"""The task context layers (DESIGN.md §7): shared context, each agent's private context, messages.

Private context and the inbox are only ever returned to the agent the `X-Agent-Id` header names
(memory/api/agent_scope.py); see docs/cognition.md. Agents are never created here: an unknown
agent (or another tenant's) answers 404.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import (
    AGENT_HEADER,
    AGENT_HEADER_PARAM,
    AS_AGENT_PARAM,
    FREE_JSON,
    IF_MATCH_PARAM,
    AgentScopedView,
    bound_agent,
)
from memory.api.base import BodySerializer, CursorSerializer, keyset_page
from memory.exceptions import AgentMismatch
from memory.models import Agent, Task
from memory.services import layers
from memory.services.agent_access import task_participation_check
from memory.services.sessions import agent_get


class TaskScopedView(AgentScopedView):
    """The layers a task's agents share: the caller acts as itself on them. A key bound to an agent
    reaches them only while its agent takes part in the task (agent_access.task_participation_check,
    403 `agent_mismatch`), checked before the handler like the other ids a bound key names."""

    agent_binding = False  # shared between the task's agents: participation, not ownership

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        bound = bound_agent(self)
        if bound:
            task = layers.task_get(tenant=self.tenant, task_id=kwargs["task_id"])
            task_participation_check(task=task, bound_agent=bound)

    def task_and_caller(self, task_id: str) -> tuple[Task, Agent]:
        """The task (404 for another tenant's) and the agent making the call (required)."""
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        caller = self.caller(required=True)
        assert caller is not None
        return task, caller


class AgentContextViewApi(AgentScopedView):
    # The task in the query is reached by participation, as on the task layers' own routes (the
    # agent in the path is still the bound key's own): checked in `get`.
    BINDING_FIELDS = ("agent", "session")

    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentContextViewQuery"

        task = serializers.CharField()

    @extend_schema(
        responses=FREE_JSON,
        parameters=[QuerySerializer, AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="The agent's read-only view of a task: shared + its own private context + its inbox",
        description="X-Agent-Id must name the agent of the path (403 agent_mismatch otherwise).",
    )
    def get(self, request: Any, agent: str) -> Response:
        data = self.validate_query(self.QuerySerializer)
        agent_row = self.agent(agent)
        task = layers.task_get(tenant=self.tenant, task_id=data["task"])
        caller = self.caller(required=True)
        if caller is None or caller.pk != agent_row.pk:
            raise AgentMismatch(details={"agent": agent, "header": AGENT_HEADER})
        task_participation_check(task=task, bound_agent=bound_agent(self) or "")
        return Response(layers.context_view(tenant=self.tenant, task=task, agent=agent_row))


class SharedContextSerializer(BodySerializer):
    goal = serializers.CharField(required=False, allow_blank=True)
    constraints = serializers.ListField(required=False)
    artifacts = serializers.ListField(required=False)
    decisions = serializers.ListField(required=False)
    dependencies = serializers.ListField(required=False)


class SharedContextPatchSerializer(SharedContextSerializer):
    json_unbounded_fields = frozenset({"append"})  # the task's shared document
    append = serializers.DictField(
        child=serializers.ListField(), required=False, help_text="Items to append to list fields."
    )

    def validate_append(self, value: dict[str, Any]) -> dict[str, Any]:
        unknown = [key for key in value if key not in layers.SHARED_LIST_FIELDS]
        if unknown:
            raise serializers.ValidationError(f"{unknown[0]!r} is not a list field of the shared context.")
        return value


class TaskSharedContextApi(TaskScopedView):
    @extend_schema(responses=FREE_JSON, summary="The task's shared context (every agent on the task sees it)")
    def get(self, request: Any, task_id: str) -> Response:
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        return Response(layers.shared_context_get(tenant=self.tenant, task=task))

    @extend_schema(
        responses=FREE_JSON,
        request=SharedContextSerializer,
        parameters=[IF_MATCH_PARAM],
        summary="Replace the task's shared context",
    )
    def put(self, request: Any, task_id: str) -> Response:
        return self._write(SharedContextSerializer, task_id, replace=True)

    @extend_schema(
        responses=FREE_JSON,
        request=SharedContextPatchSerializer,
        parameters=[IF_MATCH_PARAM],
        summary="Change some fields of the task's shared context, or append to its lists",
    )
    def patch(self, request: Any, task_id: str) -> Response:
        return self._write(SharedContextPatchSerializer, task_id, replace=False)

    def _write(self, serializer: type[serializers.Serializer], task_id: str, *, replace: bool) -> Response:
        data = self.validate(serializer)
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        append = data.pop("append", None)
        result = layers.shared_context_write(
            tenant=self.tenant,
            task=task,
            values=data,
            append=append,
            replace=replace,
            agent=self.caller(required=False),
            expected_version=self.expected_version(),
        )
        return Response(result)


class TaskPrivateContextApi(TaskScopedView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "TaskPrivateContextInput"

        json_unbounded_fields = frozenset({"data"})  # the agent's private document
        data = serializers.DictField(  # type: ignore[assignment]
            help_text="Any JSON object; only the calling agent ever reads it."
        )

    @extend_schema(
        responses=FREE_JSON,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="The calling agent's private context on the task",
    )
    def get(self, request: Any, task_id: str) -> Response:
        task, caller = self.task_and_caller(task_id)
        return Response(layers.private_context_get(tenant=self.tenant, task=task, agent=caller).__dict__)

    @extend_schema(
        responses=FREE_JSON,
        request=InputSerializer,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM, IF_MATCH_PARAM],
        summary="Replace the calling agent's private context on the task",
    )
    def put(self, request: Any, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task, caller = self.task_and_caller(task_id)
        view = layers.private_context_put(
            tenant=self.tenant,
            task=task,
            agent=caller,
            data=data["data"],
            expected_version=self.expected_version(),
        )
        return Response(view.__dict__)


class TaskMessagesApi(TaskScopedView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "TaskMessagesInput"

        to = serializers.CharField(
            required=False,
            allow_null=True,
            default=None,
            help_text="The recipient agent; omit or null to broadcast.",
        )
        body = serializers.JSONField()

    class QuerySerializer(CursorSerializer):
        class Meta:
            ref_name = "TaskMessagesQuery"

        box = serializers.ChoiceField(choices=["all", "inbox", "sent"], default="all", required=False)
        unread = serializers.BooleanField(required=False, default=False)

    @extend_schema(
        responses=FREE_JSON,
        parameters=[QuerySerializer, AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="Messages on the task the calling agent may see (to it, broadcast, or from it), oldest first",
    )
    def get(self, request: Any, task_id: str) -> Response:
        data = self.validate_query(self.QuerySerializer)
        task, caller = self.task_and_caller(task_id)
        queryset = layers.ipc_list(
            tenant=self.tenant, task=task, agent=caller, box=data["box"], unread_only=data["unread"]
        )
        rows, next_cursor = keyset_page(
            queryset, cursor=data.get("cursor"), limit=data.get("limit"), newest_first=False
        )
        items = [layers.ipc_dict(m) for m in rows]
        return Response({"items": items, "next": next_cursor, "next_cursor": next_cursor})

    @extend_schema(
        responses={201: FREE_JSON},
        request=InputSerializer,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="Send a message on the task",
    )
    def post(self, request: Any, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task, sender = self.task_and_caller(task_id)
        recipient = agent_get(tenant=self.tenant, external_id=data["to"]) if data["to"] else None
        message = layers.ipc_send(
            tenant=self.tenant, task=task, sender=sender, recipient=recipient, body=data["body"]
        )
        return Response(layers.ipc_dict(message), status=201)


class TaskMessagesReadApi(TaskScopedView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "TaskMessagesReadInput"

        ids = serializers.ListField(
            child=serializers.CharField(),
            required=False,
            allow_null=True,
            default=None,
            help_text="Message ids to mark read; omit to mark the whole inbox read.",
        )

    @extend_schema(
        responses=FREE_JSON,
        request=InputSerializer,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="Mark inbox messages read",
    )
    def post(self, request: Any, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task, caller = self.task_and_caller(task_id)
        count = layers.ipc_mark_read(tenant=self.tenant, task=task, agent=caller, message_ids=data["ids"])
        return Response({"marked_read": count})


urlpatterns = [
    path("agents/<str:agent>/context-view", AgentContextViewApi.as_view(), name="api-agent-context-view"),
    path(
        "tasks/<str:task_id>/shared-context", TaskSharedContextApi.as_view(), name="api-task-shared-context"
    ),
    path(
        "tasks/<str:task_id>/private-context",
        TaskPrivateContextApi.as_view(),
        name="api-task-private-context",
    ),
    path("tasks/<str:task_id>/messages", TaskMessagesApi.as_view(), name="api-task-messages"),
    path("tasks/<str:task_id>/messages/read", TaskMessagesReadApi.as_view(), name="api-task-messages-read"),
]
