"""Cognitive state, checkpoints, recovery and reducers (DESIGN.md §7).

The calling agent is named by the `X-Agent-Id` header (memory/api/agent_scope.py): the API key
identifies the tenant, the header which of its agents is asking. The task context layers are in
memory/api/task_context.py. Agents are never created here: an unknown agent (or another
tenant's) answers 404.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import (
    AGENT_HEADER_PARAM,
    AS_AGENT_PARAM,
    FREE_JSON,
    IF_MATCH_PARAM,
    AgentScopedView,
)
from memory.api.base import MAX_BIGINT, BodySerializer, CursorSerializer, keyset_page
from memory.api.parsers import JsonPatchParser, TextSafeJSONParser
from memory.api.shapes import (
    CheckpointOutputSerializer,
    CheckpointPageSerializer,
    ReducersSerializer,
    StateViewSerializer,
    checkpoint_out,
    recovered_state_out,
    reducers_out,
    state_out,
)
from memory.exceptions import InvalidInput
from memory.services import cognition, recovery


def dotted_path(path: str) -> bool:
    """`a.b.c`: no empty part."""
    return all(part for part in path.split("."))


# --- cognitive state ---------------------------------------------------------------------------


class AgentStateApi(AgentScopedView):
    idempotent_optimistic = True  # a hot path: one statement for its Idempotency-Key
    parser_classes = [TextSafeJSONParser, JsonPatchParser]  # PATCH takes application/json-patch+json

    @extend_schema(responses=StateViewSerializer, summary="The agent's cognitive state (schema 1)")
    def get(self, request: Any, agent: str) -> Response:
        view = cognition.state_get(tenant=self.tenant, agent=self.agent(agent))
        response = Response(state_out(view))
        response["ETag"] = f'"{view.version}"'
        return response

    @extend_schema(
        request=FREE_JSON,
        responses=StateViewSerializer,
        parameters=[IF_MATCH_PARAM],
        summary="Replace the agent's cognitive state",
        description="Body: {schema_version: 1, context: {goal, constraints}, observation, working_memory, "
        "decision, tool_state}. No schema_version = legacy 0, upgraded. A newer schema_version → 422 "
        "schema_version_unsupported; a wrong type → 400 invalid_state naming the field.",
    )
    def put(self, request: Any, agent: str) -> Response:
        agent_row = self.agent(agent)
        expected_version = self.expected_version()
        state = cognition.state_input_parse(request.data)  # 400 invalid_state, 422 for a newer schema
        view = cognition.state_put(
            tenant=self.tenant, agent=agent_row, state=state, expected_version=expected_version
        )
        return Response(state_out(view))

    class PatchSerializer(BodySerializer):
        class Meta:
            ref_name = "AgentStatePatchInput"

        patch = serializers.ListField(
            child=serializers.DictField(), help_text="RFC 6902 operations, paths relative to the state."
        )

    @extend_schema(
        request=PatchSerializer,
        responses=StateViewSerializer,
        parameters=[IF_MATCH_PARAM],
        summary="Change the agent's cognitive state by a JSON Patch (RFC 6902)",
        description="Body: the operations as a JSON array (`Content-Type: application/json-patch+json` or "
        "`application/json`), or `{patch: [...]}`. Paths are relative to the state "
        "(`/working_memory/notes/-`). Applied under the state's lock, all or nothing; a patch that does "
        "not apply → 422 invalid_patch; a result that is not a valid state → 400 invalid_state.",
    )
    def patch(self, request: Any, agent: str) -> Response:
        body = request.data
        data = self.validate(self.PatchSerializer, data={"patch": body} if isinstance(body, list) else body)
        agent_row = self.agent(agent)
        view = cognition.state_put(
            tenant=self.tenant, agent=agent_row, patch=data["patch"], expected_version=self.expected_version()
        )
        return Response(state_out(view))


class AgentStateRestoreApi(AgentScopedView):
    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "AgentStateRestoreInput"

        checkpoint = serializers.CharField(help_text="Seq or id (ckpt_…) of the checkpoint to restore.")
        reason = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")

    @extend_schema(
        request=InputSerializer,
        responses={
            201: inline_serializer(
                "StateRestoredOut",
                {"state": StateViewSerializer(), "checkpoint": CheckpointOutputSerializer()},
            )
        },
        summary="Restore the state of a checkpoint (writes a new state and checkpoint; history is kept)",
    )
    def post(self, request: Any, agent: str) -> Response:
        data = self.validate(self.InputSerializer)
        view, checkpoint = cognition.state_restore(
            tenant=self.tenant, agent=self.agent(agent), ref=data["checkpoint"], reason=data["reason"]
        )
        return Response({"state": state_out(view), "checkpoint": checkpoint_out(checkpoint)}, status=201)


# --- checkpoints -------------------------------------------------------------------------------


class AgentCheckpointsApi(AgentScopedView):
    idempotent_optimistic = True  # a hot path: one statement for its Idempotency-Key
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "AgentCheckpointsInput"

        json_unbounded_fields = frozenset({"state"})  # a document
        reason = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
        step = serializers.IntegerField(
            required=False, allow_null=True, default=None, min_value=-MAX_BIGINT, max_value=MAX_BIGINT
        )
        produced_by = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
        state = serializers.JSONField(
            required=False, default=None, help_text="Write this state first, then checkpoint it (one call)."
        )
        patch = serializers.ListField(
            child=serializers.DictField(),
            required=False,
            default=None,
            allow_null=True,
            help_text="Instead of `state`: change the current state by this JSON Patch (RFC 6902), then "
            "checkpoint it (one call).",
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if attrs.get("state") is not None and attrs.get("patch") is not None:
                raise serializers.ValidationError({"patch": ["Send either `state` or `patch`, not both."]})
            return attrs

    @extend_schema(
        parameters=[CursorSerializer],
        responses=CheckpointPageSerializer,
        summary="The agent's checkpoints, newest first",
    )
    def get(self, request: Any, agent: str) -> Response:
        data = self.validate_query(CursorSerializer)
        rows, next_cursor = keyset_page(
            cognition.checkpoints_list(tenant=self.tenant, agent=self.agent(agent)).select_related("agent"),
            cursor=data.get("cursor"),
            limit=data.get("limit"),
        )
        items = [checkpoint_out(c) for c in rows]
        return Response({"items": items, "next": next_cursor, "next_cursor": next_cursor})

    @extend_schema(
        request=InputSerializer,
        responses={201: CheckpointOutputSerializer},
        summary="Take a checkpoint of the agent's cognitive state",
    )
    def post(self, request: Any, agent: str) -> Response:
        data = self.validate(self.InputSerializer)
        checkpoint = cognition.checkpoint_create(tenant=self.tenant, agent=self.agent(agent), **data)
        return Response(checkpoint_out(checkpoint), status=201)


class AgentCheckpointDetailApi(AgentScopedView):
    @extend_schema(
        responses=CheckpointOutputSerializer,
        summary="One checkpoint (by seq or id) with the state it recorded",
    )
    def get(self, request: Any, agent: str, ref: str) -> Response:
        checkpoint = cognition.checkpoint_get(tenant=self.tenant, agent=self.agent(agent), ref=ref)
        return Response(checkpoint_out(checkpoint, cognition.checkpoint_state(checkpoint=checkpoint)))


BLOB_FIELDS: dict[str, serializers.Field] = {
    "sha256": serializers.CharField(),
    "size": serializers.IntegerField(help_text="Bytes."),
    "created_at": serializers.DateTimeField(),
}


class AgentBlobApi(AgentScopedView):
    """A large value kept beside the agent's checkpoints and events, by the SHA-256 of its bytes."""

    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "AgentBlobInput"

        base64 = serializers.CharField(
            allow_blank=True,
            trim_whitespace=False,
            help_text="The bytes, base64 (standard alphabet, padded). Bounded by CTXAPP_MAX_BODY_BYTES.",
        )

        def validate_base64(self, value: str) -> bytes:
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise serializers.ValidationError("Must be base64 (standard alphabet, padded).") from None

    BlobSerializer = inline_serializer("AgentBlob", BLOB_FIELDS)
    BlobDataSerializer = inline_serializer(
        "AgentBlobData", {**BLOB_FIELDS, "base64": serializers.CharField(help_text="The bytes, base64.")}
    )

    @staticmethod
    def _out(blob: Any) -> dict[str, Any]:
        return {"sha256": blob.sha256, "size": blob.size, "created_at": blob.created_at.isoformat()}

    @extend_schema(
        request=InputSerializer,
        responses={201: BlobSerializer, 200: BlobSerializer},
        summary="Store a blob under the SHA-256 of its bytes",
        description="201 when stored, 200 when the agent already holds these bytes (nothing written). "
        "A SHA-256 that is not the data's → 422. Checkpoints and events carry the reference, not the "
        "bytes (CtxappSaver keeps large LangGraph values so). Deleted with the agent.",
    )
    def put(self, request: Any, agent: str, sha256: str) -> Response:
        data = self.validate(self.InputSerializer)
        blob, created = cognition.blob_put(
            tenant=self.tenant, agent=self.agent(agent), sha256=sha256, data=data["base64"]
        )
        return Response(self._out(blob), status=201 if created else 200)

    @extend_schema(responses=BlobDataSerializer, summary="A blob's bytes (base64)")
    def get(self, request: Any, agent: str, sha256: str) -> Response:
        blob = cognition.blob_get(tenant=self.tenant, agent=self.agent(agent), sha256=sha256)
        return Response({**self._out(blob), "base64": base64.b64encode(bytes(blob.data)).decode()})


class AgentCheckpointDiffApi(AgentScopedView):
    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentCheckpointDiffQuery"

        # "from" is a Python keyword: the field is declared under its query-string name below.
        to = serializers.CharField(help_text="Seq or id of the newer checkpoint.")

    QuerySerializer._declared_fields["from"] = serializers.CharField(
        help_text="Seq or id of the older checkpoint."
    )

    @extend_schema(
        responses=FREE_JSON,
        parameters=[QuerySerializer],
        summary="What changed between two checkpoints, per JSON path",
    )
    def get(self, request: Any, agent: str) -> Response:
        data = self.validate_query(self.QuerySerializer)
        diff = cognition.checkpoint_diff(
            tenant=self.tenant, agent=self.agent(agent), source=data["from"], target=data["to"]
        )
        counts = {
            kind: sum(1 for c in diff.changes if c["change"] == kind)
            for kind in ("added", "removed", "changed")
        }
        return Response(
            {
                "from": checkpoint_out(diff.source),
                "to": checkpoint_out(diff.target),
                "changes": diff.changes,
                "summary": counts,
            }
        )


# --- recovery and reducers ---------------------------------------------------------------------


class AgentRecoveredStateApi(AgentScopedView):
    @extend_schema(
        responses=FREE_JSON,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="Everything the agent needs to resume after a crash",
        description="The fold of its events, the latest checkpoint's state, the current state, the latest "
        "session and recent messages, open tasks with shared context, events after the checkpoint. Private "
        "context and inbox only when X-Agent-Id names this agent. Records agent.recovered.",
    )
    def get(self, request: Any, agent: str) -> Response:
        agent_row = self.agent(agent)
        caller = self.caller(required=False)
        result = recovery.recovered_state(tenant=self.tenant, agent=agent_row, caller=caller)
        return Response(recovered_state_out(result))


class AgentReducersApi(AgentScopedView):
    class ReducerSerializer(BodySerializer):
        class Meta:
            ref_name = "AgentReducersReducer"

        event_type = serializers.CharField(max_length=100)
        op = serializers.ChoiceField(choices=["set", "merge", "append"])
        target = serializers.CharField(max_length=200)
        source = serializers.CharField(  # type: ignore[assignment]
            max_length=200, required=False, allow_blank=True, default=""
        )

        def validate_event_type(self, value: str) -> str:
            if not value.startswith("agent.") or len(value) <= len("agent."):
                raise serializers.ValidationError(
                    "Reducers apply to the agent's own event types, which start with 'agent.'."
                )
            return value

        def validate_target(self, value: str) -> str:
            if not dotted_path(value):
                raise serializers.ValidationError("A dotted path such as 'progress.last_step'.")
            return value

        def validate_source(self, value: str) -> str:
            if value and not dotted_path(value):
                raise serializers.ValidationError(
                    "A dotted path in the payload such as 'result.value', or empty."
                )
            return value

    class InputSerializer(BodySerializer):
        class Meta:
            ref_name = "AgentReducersInput"

        reducers = serializers.ListField(child=serializers.DictField(), max_length=100)

    @extend_schema(responses=ReducersSerializer, summary="The agent's declared reducers")
    def get(self, request: Any, agent: str) -> Response:
        reducers = recovery.reducers_get(tenant=self.tenant, agent=self.agent(agent))
        return Response(reducers_out(reducers))

    @extend_schema(
        responses=ReducersSerializer,
        request=InputSerializer,
        summary="Declare how the agent's agent.* events fold (replaces all)",
    )
    def put(self, request: Any, agent: str) -> Response:
        data = self.validate(self.InputSerializer)
        items = []
        for index, item in enumerate(data["reducers"]):
            serializer = self.ReducerSerializer(data=item)
            if not serializer.is_valid():
                field, errors = next(iter(serializer.errors.items()))
                raise InvalidInput(
                    f"reducers[{index}].{field}: {errors[0]}",
                    details={"fields": {f"reducers[{index}].{field}": [str(e) for e in errors]}},
                )
            items.append(recovery.Reducer(**serializer.validated_data))
        reducers = recovery.reducers_put(tenant=self.tenant, agent=self.agent(agent), reducers=items)
        return Response(reducers_out(reducers))


urlpatterns = [
    path("agents/<str:agent>/state", AgentStateApi.as_view(), name="api-agent-state"),
    path("agents/<str:agent>/state/restore", AgentStateRestoreApi.as_view(), name="api-agent-state-restore"),
    path("agents/<str:agent>/checkpoints", AgentCheckpointsApi.as_view(), name="api-agent-checkpoints"),
    path(
        "agents/<str:agent>/checkpoints/diff",
        AgentCheckpointDiffApi.as_view(),
        name="api-agent-checkpoint-diff",
    ),
    path(
        "agents/<str:agent>/checkpoints/<str:ref>",
        AgentCheckpointDetailApi.as_view(),
        name="api-agent-checkpoint",
    ),
    path(
        "agents/<str:agent>/recovered-state",
        AgentRecoveredStateApi.as_view(),
        name="api-agent-recovered-state",
    ),
    path("agents/<str:agent>/reducers", AgentReducersApi.as_view(), name="api-agent-reducers"),
    path("agents/<str:agent>/blobs/<str:sha256>", AgentBlobApi.as_view(), name="api-agent-blob"),
]
