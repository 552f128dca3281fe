"""The key-value store (`POST /store/batch`): LangGraph's BaseStore operations, a batch per request.

Each operation is `{"op": "get" | "put" | "search" | "list_namespaces", …}`; the answer holds one
result per operation, in order. A key bound to an agent has a store of its own.
"""

from __future__ import annotations

import math
from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import bound_agent
from memory.api.base import BodySerializer, TenantApiView
from memory.models import ApiKeyScope, StoreItem
from memory.services import store

MAX_OPS = 100
MAX_TTL_MINUTES = 60 * 24 * 365 * 100  # a century


def _labels(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(max_length=200), max_length=20, **kwargs)


class GetOpSerializer(BodySerializer):
    op = serializers.ChoiceField(choices=["get"])
    namespace = _labels()
    key = serializers.CharField(max_length=1000)
    refresh_ttl = serializers.BooleanField(required=False, default=True)


class PutOpSerializer(BodySerializer):
    # The item is the document itself: bounded by the body's limit (CTXAPP_MAX_BODY_BYTES).
    json_unbounded_fields = frozenset({"value"})

    op = serializers.ChoiceField(choices=["put"])
    namespace = _labels(min_length=1)
    key = serializers.CharField(max_length=1000)
    value = serializers.DictField(allow_null=True, help_text="null deletes the item.")
    texts = serializers.ListField(
        child=serializers.CharField(max_length=20_000),
        required=False,
        default=list,
        max_length=50,
        help_text="What search by meaning embeds (none: the item is found by namespace and filter only).",
    )
    ttl = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        min_value=0.0001,
        max_value=MAX_TTL_MINUTES,
        help_text="Minutes the item lives (refreshed by reads that ask for it); none: forever.",
    )

    def validate_ttl(self, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise serializers.ValidationError("Must be a finite number of minutes.")
        return value


class SearchOpSerializer(BodySerializer):
    op = serializers.ChoiceField(choices=["search"])
    namespace_prefix = _labels(required=False, default=list)
    filter = serializers.DictField(required=False, allow_null=True, default=None)
    limit = serializers.IntegerField(required=False, default=10, min_value=0, max_value=1000)
    offset = serializers.IntegerField(required=False, default=0, min_value=0)
    query = serializers.CharField(required=False, allow_null=True, default=None, max_length=10_000)
    refresh_ttl = serializers.BooleanField(required=False, default=True)


class ListNamespacesOpSerializer(BodySerializer):
    op = serializers.ChoiceField(choices=["list_namespaces"])
    prefix = _labels(required=False, allow_null=True, default=None)
    suffix = _labels(required=False, allow_null=True, default=None)
    max_depth = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1)
    limit = serializers.IntegerField(required=False, default=100, min_value=0, max_value=1000)
    offset = serializers.IntegerField(required=False, default=0, min_value=0)


OP_SERIALIZERS: dict[str, type[BodySerializer]] = {
    "get": GetOpSerializer,
    "put": PutOpSerializer,
    "search": SearchOpSerializer,
    "list_namespaces": ListNamespacesOpSerializer,
}


@extend_schema_field(
    {
        "type": "object",
        "description": "One operation: `op` (get, put, search, list_namespaces) and its fields.",
        "properties": {"op": {"type": "string", "enum": list(OP_SERIALIZERS)}},
        "required": ["op"],
        "additionalProperties": True,
    }
)
class OpField(serializers.Field):
    """One operation, validated by the serializer its `op` names, into a store.Op."""

    def to_internal_value(self, data: Any) -> store.Op:
        kind = data.get("op") if isinstance(data, dict) else None
        if not isinstance(kind, str) or kind not in OP_SERIALIZERS:  # {} or [] is no name (unhashable)
            raise serializers.ValidationError({"op": [f"One of: {', '.join(OP_SERIALIZERS)}."]})
        serializer = OP_SERIALIZERS[kind](data=data)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        return _op(values)


def _op(values: dict[str, Any]) -> store.Op:
    kind = values.pop("op")
    if kind == "get":
        return "get", (tuple(values["namespace"]), values["key"], values["refresh_ttl"])
    if kind == "put":
        namespace = tuple(values["namespace"])
        put = store.Put(namespace, values["key"], values["value"], values["texts"], values["ttl"])
        return "put", put
    if kind == "search":
        return "search", store.Search(**{**values, "namespace_prefix": tuple(values["namespace_prefix"])})
    for name in ("prefix", "suffix"):
        values[name] = tuple(values[name]) if values[name] else None
    return "list", store.ListNamespaces(**values)


class BatchSerializer(BodySerializer):
    ops = serializers.ListField(child=OpField(), min_length=1, max_length=MAX_OPS)


class StoreItemSerializer(serializers.Serializer):
    namespace = serializers.ListField(child=serializers.CharField())
    key = serializers.CharField()
    value = serializers.DictField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    score = serializers.FloatField(allow_null=True, required=False)


def _item(item: StoreItem, score: float | None = None, *, scored: bool = False) -> dict[str, Any]:
    shown = {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": item.created_at.isoformat(),
        "updated_at": item.updated_at.isoformat(),
    }
    return {**shown, "score": score} if scored else shown


def _result(kind: str, result: Any) -> Any:
    if kind == "get":
        return None if result is None else _item(result)
    if kind == "search":
        return [_item(item, score, scored=True) for score, item in result]
    if kind == "list":
        return [list(ns) for ns in result]
    return None


class StoreBatchOutSerializer(serializers.Serializer):
    results = serializers.ListField(
        child=serializers.JSONField(allow_null=True),
        help_text="One per operation: a StoreItem or null (get), a list of StoreItems (search), a list "
        "of namespaces (list_namespaces), or null (put).",
    )


class StoreBatchApi(TenantApiView):
    required_scope = ApiKeyScope.READ  # a batch that only reads; puts also need `write` (below)

    @extend_schema(
        request=BatchSerializer,
        responses=StoreBatchOutSerializer,
        summary="Get, put, delete, search and list the namespaces of the key-value store, in one batch",
        description="`results[i]` answers `ops[i]`: an item or null (get), a list of items with "
        "`score` (search), a list of namespaces (list_namespaces), null (put). Search by meaning "
        "ranks by the embedded `texts` of each item.",
    )
    def post(self, request: Any) -> Response:
        data = self.validate(BatchSerializer)
        scopes = set(request.auth.effective_scopes)
        if any(kind == "put" for kind, _ in data["ops"]) and not scopes & {
            ApiKeyScope.WRITE,
            ApiKeyScope.ADMIN,
        }:
            self.permission_denied(request, message="This API key lacks the 'write' scope a put needs.")
        scope = store.StoreScope(self.tenant, bound_agent(self) or "")
        results = store.store_batch(scope=scope, ops=data["ops"])
        return Response(
            {
                "results": [
                    _result(kind, result) for (kind, _), result in zip(data["ops"], results, strict=True)
                ]
            }
        )


urlpatterns = [path("store/batch", StoreBatchApi.as_view(), name="api-store-batch")]
