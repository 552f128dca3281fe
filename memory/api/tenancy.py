"""GET /api/v1/tenant: who am I (the key's tenant and scopes)."""

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.base import TenantApiView


class TenantApi(TenantApiView):
    class OutputSerializer(serializers.Serializer):
        slug = serializers.CharField()
        name = serializers.CharField()
        key_prefix = serializers.CharField()
        scopes = serializers.ListField(child=serializers.CharField())

    @extend_schema(responses=OutputSerializer, summary="The tenant of the calling API key")
    def get(self, request: Any) -> Response:
        key = request.auth
        return Response(
            self.OutputSerializer(
                {
                    "slug": self.tenant.slug,
                    "name": self.tenant.name,
                    "key_prefix": key.prefix,
                    "scopes": sorted(key.effective_scopes),
                }
            ).data
        )


urlpatterns = [path("tenant", TenantApi.as_view(), name="api-tenant")]
