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


# --- error responses ----------------------------------------------------------------------------

ERROR_SCHEMA = {
    "type": "object",
    "description": "Every API error: a stable `code`, a message that says how to fix it, and details.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Stable, e.g. `validation_error`, `not_found`."},
                "message": {"type": "string"},
                "details": {"type": "object", "additionalProperties": True},
            },
            "required": ["code", "message", "details"],
        }
    },
    "required": ["error"],
}

ERROR_DESCRIPTIONS = {
    "400": "`invalid_json`: the body is not JSON (or, for states, a wrong type: `invalid_state`).",
    "401": "`unauthenticated` / `invalid_api_key`: no key, or an unknown, revoked or expired one.",
    "403": "`forbidden` (the key lacks the scope) or `agent_mismatch` (a key bound to another agent).",
    "404": "`not_found`: no such object for this tenant (another tenant's id answers the same).",
    "409": "A conflict: `idempotency_conflict`, `idempotency_in_progress`, a version or state conflict.",
    "413": "`payload_too_large`: the body (or a field of it) is over its limit.",
    "415": "`unsupported_media_type`: send the body as JSON (`Content-Type: application/json`).",
    "422": "`validation_error`: `details.fields` names each invalid field (body or query parameter).",
    "429": "`rate_limited`: too many requests; wait `Retry-After` seconds.",
    "503": "`database_unavailable`: the database is not reachable; nothing was applied. Retry after "
    "`Retry-After` seconds.",
}
BODY_METHODS = frozenset({"post", "put", "patch"})


def error_codes_of(method: str, operation: dict[str, Any]) -> set[str]:
    """The error statuses an API operation can answer, from what it takes (method, auth, inputs).

    Every authenticated operation: 401, 403 (scope, agent binding), 429 (throttles), 503 (the
    database is unreachable). Any input
    (path, query, body) can name an unknown object: 404. Query parameters are validated: 422. A
    body can be unparseable (400), of the wrong type (415), too large (413) or invalid (422), and
    every write can meet an Idempotency-Key or version conflict (409).
    """
    codes: set[str] = set()
    if operation.get("security") and any(requirement for requirement in operation["security"]):
        codes |= {"401", "403", "429", "503"}  # 503: the database is unreachable (nothing applied)
    parameters = operation.get("parameters", [])
    has_body = method in BODY_METHODS
    if parameters or has_body:
        codes.add("404")
    if any(p.get("in") in {"query", "header"} for p in parameters):
        codes.add("422")
    if has_body:
        codes |= {"400", "409", "413", "415", "422"}
    if method == "delete":
        codes.add("409")
    return codes


def declare_error_responses(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: declare each operation's error responses, once, here.

    Views declare only their success bodies; the error envelope (`Error`) and the statuses it can
    come with are added per operation by `error_codes_of`, so the schema never forgets one.
    """
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    reference = {"$ref": "#/components/schemas/Error"}
    for path, item in result.get("paths", {}).items():
        if not path.startswith(("/api/v1/", "/v1/")):  # the REST API and OTLP ingest (/v1/traces)
            continue
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            for code in sorted(error_codes_of(method, operation)):
                responses.setdefault(
                    code,
                    {
                        "description": ERROR_DESCRIPTIONS[code],
                        "content": {"application/json": {"schema": reference}},
                    },
                )
    return result
