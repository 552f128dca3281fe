"""The tenant's agents: who has sessions here, how many, and when they were last active; and
deleting an agent with everything kept under it.

Agents are created on first use (a session, a task, an event). A key bound to an agent sees only
that agent (another agent's name answers 403, as everywhere).
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import agent_filter_for_read
from memory.api.base import (
    CursorSerializer,
    KeysetPagination,
    TenantApiView,
    keyset_response,
    page_serializer,
)
from memory.api.shapes import IsoDateTimeField
from memory.selectors import sessions as selectors
from memory.services.agent_lifecycle import agent_delete


class AgentOutputSerializer(serializers.Serializer):
    name = serializers.CharField(source="external_id", help_text="The agent's external id (gen_ai.agent.id).")
    created_at = IsoDateTimeField(help_text="When the agent was first used.")
    session_count = serializers.IntegerField(help_text="Its sessions of any status still stored.")
    last_active_at = IsoDateTimeField(
        allow_null=True, help_text="The latest access to one of its sessions; null without sessions."
    )


AgentPageSerializer = page_serializer("AgentPage", AgentOutputSerializer(many=True), KeysetPagination)


class AgentListApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema_serializer(component_name="AgentFilter")
    class FilterSerializer(CursorSerializer):
        prefix = serializers.CharField(
            required=False, max_length=200, help_text="Only agents whose name starts with this."
        )
        name = serializers.CharField(
            required=False,
            max_length=200,
            help_text="Only the agent of this name: an empty page, not a 404, when there is none "
            "(a client can ask whether an agent exists without a failing request).",
        )

    @extend_schema(
        parameters=[FilterSerializer],
        responses=AgentPageSerializer,
        summary="List the tenant's agents, newest first, with session counts and last activity",
        description="The list envelope `{items, next}`; pass `next` as `cursor`. A key bound to an "
        "agent lists that agent only.",
    )
    def get(self, request: Any) -> Response:
        data = self.validate_query(self.FilterSerializer)
        queryset = selectors.agents_list(
            tenant=self.tenant,
            external_id=agent_filter_for_read(self, data.get("name")),
            prefix=data.get("prefix"),
        )
        return keyset_response(self, queryset, AgentOutputSerializer)


class AgentDetailApi(TenantApiView):
    @extend_schema(
        responses=AgentOutputSerializer,
        summary="Read one agent with its session count and last activity",
        description="404 `not_found` for an unknown agent or another tenant's.",
    )
    def get(self, request: Any, agent: str) -> Response:
        row = selectors.agent_detail(tenant=self.tenant, external_id=agent)
        return Response(AgentOutputSerializer(row).data)

    @extend_schema(
        responses={204: None},
        summary="Delete an agent and everything kept under it",
        description="Its sessions and messages, state, checkpoints, reducers and the events of its "
        "stream; records `agent.deleted` on the tenant stream.",
    )
    def delete(self, request: Any, agent: str) -> Response:
        agent_delete(tenant=self.tenant, agent=selectors.agent_get(tenant=self.tenant, external_id=agent))
        return Response(status=204)


urlpatterns = [
    path("agents", AgentListApi.as_view(), name="api-agents"),
    path("agents/<str:agent>", AgentDetailApi.as_view(), name="api-agent"),
]
