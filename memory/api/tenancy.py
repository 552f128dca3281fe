"""The caller's tenant and its API keys.

GET    /api/v1/tenant                      who am I (the key's tenant and scopes)
GET    /api/v1/tenant/api-keys             the tenant's keys (admin scope)
POST   /api/v1/tenant/api-keys             a new key; its secret is in this response only (admin)
DELETE /api/v1/tenant/api-keys/{prefix}    revoke a key (admin; idempotent)
GET    /api/v1/tenant/policies/sharing     which kinds one agent's builds may read of another's (admin)
PATCH  /api/v1/tenant/policies/sharing     share a kind across agents, or stop (admin)
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response

from memory.api.auth import ApiPrincipal
from memory.api.base import BodySerializer, CursorSerializer, JsonBooleanField, TenantApiView, keyset_page
from memory.models import ApiKey, ApiKeyScope
from memory.services import sharing
from memory.services.tenancy import api_key_create, api_key_get, api_key_list, api_key_revoke


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


def _status(key: ApiKey) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= timezone.now():
        return "expired"
    return "active"


class ApiKeyOutputSerializer(serializers.Serializer):
    prefix = serializers.CharField(help_text="The visible part of the key: ctx_<prefix>_…")
    name = serializers.CharField()
    scopes = serializers.ListField(child=serializers.CharField(), help_text="Empty = read and write.")
    status = serializers.ChoiceField(choices=["active", "expired", "revoked"])
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    agent = serializers.CharField(
        allow_blank=True, help_text="The agent the key is bound to (it always acts as it); empty = any agent."
    )


def api_key_out(key: ApiKey) -> dict[str, Any]:
    return ApiKeyOutputSerializer(
        {
            "prefix": key.prefix,
            "name": key.name,
            "scopes": key.scopes,
            "status": _status(key),
            "created_at": key.created_at,
            "last_used_at": key.last_used_at,
            "expires_at": key.expires_at,
            "revoked_at": key.revoked_at,
            "agent": key.agent_external_id,
        }
    ).data


def _actor(request: Any) -> str:
    principal = request.user
    return str(principal) if isinstance(principal, ApiPrincipal) else "api"


class ApiKeyListCreateApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)
    required_scope = ApiKeyScope.ADMIN

    class InputSerializer(BodySerializer):
        name = serializers.CharField(max_length=200)
        scopes = serializers.ListField(
            child=serializers.ChoiceField(choices=ApiKeyScope.values), required=False, default=list
        )
        expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
        agent = serializers.CharField(
            max_length=200, required=False, default="", help_text="Bind the key to this agent (optional)."
        )

        def validate_expires_at(self, value: Any) -> Any:
            if value is not None and value <= timezone.now():
                raise serializers.ValidationError("Must be in the future.")
            return value

    class CreatedSerializer(ApiKeyOutputSerializer):
        key = serializers.CharField(
            help_text="The full secret key. Shown in this response only: store it now."
        )

    class PageSerializer(serializers.Serializer):
        items = ApiKeyOutputSerializer(many=True)
        next = serializers.CharField(allow_null=True, help_text="Pass as `cursor` for the next page.")
        next_cursor = serializers.CharField(allow_null=True, help_text="Deprecated: `next`.")

    @extend_schema(
        request=InputSerializer,
        responses={201: CreatedSerializer},
        summary="Create an API key for the caller's tenant (admin scope); the secret is shown once",
    )
    def post(self, request: Any) -> Response:
        data = self.validate(self.InputSerializer)
        key, secret = api_key_create(
            tenant=self.tenant,
            name=data["name"],
            scopes=data["scopes"],
            expires_at=data["expires_at"],
            agent_external_id=data["agent"],
            actor=_actor(request),
        )
        return Response({**api_key_out(key), "key": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[CursorSerializer], responses=PageSerializer, summary="The tenant's API keys (admin scope)"
    )
    def get(self, request: Any) -> Response:
        page = self.validate_query(CursorSerializer)
        rows, next_cursor = keyset_page(
            api_key_list(tenant=self.tenant), cursor=page.get("cursor"), limit=page.get("limit")
        )
        items = [api_key_out(key) for key in rows]
        return Response({"items": items, "next": next_cursor, "next_cursor": next_cursor})


class ApiKeyDetailApi(TenantApiView):
    required_scope = ApiKeyScope.ADMIN

    @extend_schema(responses=ApiKeyOutputSerializer, summary="One of the tenant's API keys (admin scope)")
    def get(self, request: Any, prefix: str) -> Response:
        return Response(api_key_out(api_key_get(tenant=self.tenant, prefix=prefix)))

    @extend_schema(
        request=None,
        responses={200: ApiKeyOutputSerializer},
        summary="Revoke an API key (admin scope); later requests with it answer 401. Idempotent.",
    )
    def delete(self, request: Any, prefix: str) -> Response:
        key = api_key_get(tenant=self.tenant, prefix=prefix)
        return Response(api_key_out(api_key_revoke(api_key=key, actor=_actor(request))))


class SharingPolicyApi(TenantApiView):
    """The tenant's sharing policy (memory/services/sharing.py). Admin scope, like its API keys."""

    required_scope = ApiKeyScope.ADMIN

    class PolicySerializer(BodySerializer):
        class Meta:
            ref_name = "SharingPolicy"

        share_digests = JsonBooleanField(
            help_text="Builds may carry digests of the user's sessions with other agents."
        )
        share_messages = JsonBooleanField(
            help_text="Recall may bring back messages, summaries and facts of other agents' sessions."
        )
        share_experiences = JsonBooleanField(
            help_text="Tenant-wide experiences recorded by other agents (or unbound keys) enter builds."
        )
        share_user_memories = JsonBooleanField(
            help_text="The user's memories recorded by other agents (or unbound keys) enter builds."
        )

    @extend_schema(responses=PolicySerializer, summary="The tenant's sharing policy (admin scope)")
    def get(self, request: Any) -> Response:
        return Response(sharing.sharing_policy_as_dict(sharing.sharing_policy_get(tenant=self.tenant)))

    @extend_schema(
        request=PolicySerializer(partial=True),
        responses=PolicySerializer,
        summary="Share a kind of text across the tenant's agents, or stop (admin scope)",
    )
    def patch(self, request: Any) -> Response:
        body = self.PolicySerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        policy = sharing.sharing_policy_update(
            tenant=self.tenant, changes=dict(body.validated_data), actor=str(request.user)
        )
        return Response(sharing.sharing_policy_as_dict(policy))


urlpatterns = [
    path("tenant", TenantApi.as_view(), name="api-tenant"),
    path("tenant/api-keys", ApiKeyListCreateApi.as_view(), name="api-tenant-api-keys"),
    path("tenant/api-keys/<str:prefix>", ApiKeyDetailApi.as_view(), name="api-tenant-api-key"),
    path("tenant/policies/sharing", SharingPolicyApi.as_view(), name="tenant-policy-sharing"),
]
