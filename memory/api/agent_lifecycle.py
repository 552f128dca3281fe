"""Agents by id prefix (`GET /agent-ids`) and deleting an agent (`DELETE /agents/{agent}`)."""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import bound_agent
from memory.api.base import CursorSerializer, TenantApiView, keyset_page
from memory.models import Agent
from memory.selectors import sessions as selectors
from memory.services.agent_lifecycle import agent_delete


class AgentIdsQuerySerializer(CursorSerializer):
    prefix = serializers.CharField(required=False, allow_blank=True, default="", max_length=200)
    exact = serializers.CharField(
        required=False, max_length=200, help_text="Only this id: an empty page when there is no such agent."
    )


class AgentIdsPageSerializer(serializers.Serializer):
    items = serializers.ListField(child=serializers.CharField())
    next = serializers.CharField(allow_null=True)
    next_cursor = serializers.CharField(allow_null=True)


class AgentIdsApi(TenantApiView):
    schema_is_list = True

    @extend_schema(
        parameters=[AgentIdsQuerySerializer],
        responses=AgentIdsPageSerializer,
        summary="The ids of the tenant's agents that start with `prefix` (or are `exact`), newest first",
        description="A key bound to an agent sees only that agent.",
    )
    def get(self, request: Any) -> Response:
        data = self.validate_query(AgentIdsQuerySerializer)
        agents = Agent.objects.filter(tenant=self.tenant, external_id__startswith=data["prefix"])
        if data.get("exact"):
            agents = agents.filter(external_id=data["exact"])
        bound = bound_agent(self)
        if bound:
            agents = agents.filter(external_id=bound)
        rows, next_cursor = keyset_page(
            agents.only("pk", "external_id"), cursor=data.get("cursor"), limit=data.get("limit")
        )
        return Response(
            {"items": [row.external_id for row in rows], "next": next_cursor, "next_cursor": next_cursor}
        )


class AgentApi(TenantApiView):
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
    path("agent-ids", AgentIdsApi.as_view(), name="api-agent-ids"),
    path("agents/<str:agent>", AgentApi.as_view(), name="api-agent"),
]
