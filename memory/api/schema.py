"""OpenAPI schema details: the bearer-key scheme, readable operation ids, tags, descriptions.

Imported from MemoryConfig.ready() so drf-spectacular finds the extension.
"""

from __future__ import annotations

import inspect
from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "memory.api.auth.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key of the tenant: `Authorization: Bearer ctx_…`.",
        }


# The capability each operation is listed under (its tag): the first rule whose path fragment
# the operation's path contains. Views of one module can serve several capabilities (sessions.py
# holds sessions, tasks and events), so the path decides, not the module.
TAG_RULES: tuple[tuple[str, str], ...] = (
    ("/v1/traces", "otel"),
    ("/context-view", "Task collaboration"),
    ("/distill", "Tasks"),
    ("/tenant", "Tenant and keys"),
    ("/facts", "Fact decay"),
    ("/compress", "Fact decay"),
    ("/digest", "Digests"),
    ("/context", "Context"),
    ("/summaries", "Context"),
    ("/usage", "Context"),
    ("/tokens", "Context"),
    ("/models", "Context"),
    ("/users/", "User memory"),
    ("/memory", "Memory search"),
    ("/experiences", "Experiences"),
    ("/events", "Flight recorder"),
    ("/state", "Cognitive state"),
    ("/checkpoints", "Cognitive state"),
    ("/reducers", "Cognitive state"),
    ("/recovered-state", "Cognitive state"),
    ("/tasks/{task_id}/", "Task collaboration"),
    ("/tasks", "Tasks"),
    ("/sessions", "Sessions"),
    ("/agents", "Agents"),
)
TAG_DESCRIPTIONS = {
    "Agents": "The tenant's agents, their sessions and what they did.",
    "Sessions": "Sessions and their messages: the conversation as it happens. A session is "
    "addressed by its id, or by its agent and the application's key (`by-key`).",
    "Context": "The next prompt within the model's budget: builds, usage reports, policy, summaries.",
    "Memory search": "Search every kind of memory: messages, summaries, facts, experiences.",
    "User memory": "What is known about each user (the `user_id` of its sessions): facts, "
    "preferences, decisions, plans; a new value supersedes the old, `as_of` shows any past moment.",
    "Experiences": "Long-term memory: what worked, preferences, configuration, constraints.",
    "Fact decay": "Facts a session must not forget, and how far each is from being lost.",
    "Digests": "A session's structured digest, for the same user's next session.",
    "Cognitive state": "An agent's operational state, its checkpoints and crash recovery.",
    "Tasks": "Execution records of what agents did, distilled into experiences.",
    "Task collaboration": "What agents working on one task share, keep private and send each other.",
    "Flight recorder": "Every state change as an event, in order, per agent.",
    "Tenant and keys": "The caller's tenant, its API keys and policies.",
    "otel": "OTLP/HTTP trace ingest (OpenTelemetry GenAI semantic conventions).",
}
SESSION_ID_DESCRIPTION = (
    "The session's id (`sess_…`), or `by-key` to name it by the `agent` and `key` query parameters."
)
BY_KEY_PARAMETERS = [
    OpenApiParameter(
        "agent",
        OpenApiTypes.STR,
        OpenApiParameter.QUERY,
        required=False,
        description="With session id `by-key`: the session's agent.",
    ),
    OpenApiParameter(
        "key",
        OpenApiTypes.STR,
        OpenApiParameter.QUERY,
        required=False,
        description="With session id `by-key`: the key the application gave the session (POST /sessions).",
    ),
]


def tag_of(path: str) -> str:
    return next((tag for fragment, tag in TAG_RULES if fragment in path), "Sessions")


class CtxappAutoSchema(AutoSchema):
    """Our views are APIViews, so drf-spectacular cannot tell a list from a read: a view whose
    GET lists says so with `schema_is_list = True` (`v1_sessions_list`, not `v1_sessions_retrieve`).

    Each operation is tagged by capability (TAG_RULES), and described by its view method's
    docstring or else its summary, never by the base view's docstring (which all would share).
    A session route also declares the `by-key` addressing (its `agent` and `key` parameters).
    """

    def get_operation_id(self) -> str:
        operation_id = super().get_operation_id()
        lists = self.method == "GET" and getattr(self.view, "schema_is_list", False)
        if lists and operation_id.endswith("_retrieve"):
            return operation_id[: -len("_retrieve")] + "_list"
        return operation_id

    def get_tags(self) -> list[str]:
        return [tag_of(self.path)]

    def get_description(self) -> str:  # type: ignore[override]  # drf-spectacular's signature
        method = getattr(self.view, self.method.lower(), None)
        own = inspect.getdoc(method) if method is not None and method.__doc__ else None
        return own or (self.get_summary() or "")

    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        if "{session_id}" in self.path:
            parameters.append(
                OpenApiParameter(
                    "session_id", OpenApiTypes.STR, OpenApiParameter.PATH, description=SESSION_ID_DESCRIPTION
                )
            )
            named = {getattr(p, "name", None) for p in parameters}
            parameters.extend(p for p in BY_KEY_PARAMETERS if p.name not in named)
        return parameters


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
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components["Error"] = ERROR_SCHEMA
    result["tags"] = [{"name": tag, "description": text} for tag, text in TAG_DESCRIPTIONS.items()]
    request_bodies_closed(result, components)
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


def request_bodies_closed(result: dict[str, Any], components: dict[str, Any]) -> None:
    """Declare what BodySerializer enforces: a request body object (and each object nested in
    it) with declared properties takes no others (`additionalProperties: false`). Free JSON
    values (a dict field: `additionalProperties` of its own) are left open."""
    seen: set[str] = set()

    def close(schema: Any) -> None:
        if not isinstance(schema, dict):
            return
        ref = schema.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                close(components.get(name))
            return
        if schema.get("type") == "object" and "properties" in schema:
            schema.setdefault("additionalProperties", False)
        for value in (*schema.get("properties", {}).values(), schema.get("items"), *schema.get("allOf", [])):
            close(value)

    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if method in BODY_METHODS:
                for media in operation.get("requestBody", {}).get("content", {}).values():
                    close(media.get("schema"))
