"""OpenAPI schema details: the bearer-key scheme and readable operation ids.

Imported from MemoryConfig.ready() so drf-spectacular finds the extension.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "memory.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key of the tenant: `Authorization: Bearer ctx_…`.",
        }


class CtxappAutoSchema(AutoSchema):
    """Our views are APIViews, so drf-spectacular cannot tell a list from a read: a view whose
    GET lists says so with `schema_is_list = True` (`v1_sessions_list`, not `v1_sessions_retrieve`)."""

    def get_operation_id(self) -> str:
        operation_id = super().get_operation_id()
        lists = self.method == "GET" and getattr(self.view, "schema_is_list", False)
        if lists and operation_id.endswith("_retrieve"):
            return operation_id[: -len("_retrieve")] + "_list"
        return operation_id
