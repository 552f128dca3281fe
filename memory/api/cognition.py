"""Cognitive state, checkpoints, recovery and the task context layers (DESIGN.md §7).

The calling agent (for private context, messages and the context view) is named by the
`X-Agent-Id` header: the API key identifies the tenant, the header which of its agents is asking.
Private context is only ever returned to the agent the header names; see docs/cognition.md.
Agents are never created here: an unknown agent (or another tenant's) answers 404.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.base import MAX_BIGINT, CursorSerializer, TenantApiView, keyset_page
from memory.api.parsers import JsonPatchParser, TextSafeJSONParser
from memory.exceptions import AgentMismatch, InvalidInput
from memory.models import Agent, Checkpoint
from memory.services import cognition, layers, recovery
from memory.services.sessions import agent_get

AGENT_HEADER = "X-Agent-Id"
AS_AGENT_PARAM = OpenApiParameter(
    "as_agent",
    OpenApiTypes.STR,
    OpenApiParameter.QUERY,
    required=False,
    description="Alternative to the X-Agent-Id header, for clients that cannot set headers.",
)
AGENT_HEADER_PARAM = OpenApiParameter(
    AGENT_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="The external id of the agent making the call (must exist in the key's tenant).",
)
IF_MATCH_PARAM = OpenApiParameter(
    "If-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="The version you read; a different stored version → 409 version_conflict.",
)
FREE_JSON = OpenApiTypes.OBJECT


class AgentScopedView(TenantApiView):
    def agent(self, external_id: str) -> Agent:
        return agent_get(tenant=self.tenant, external_id=external_id)

    def caller(self, *, required: bool) -> Agent | None:
        """The agent making the call: the key's bound agent, else the X-Agent-Id header or `as_agent`."""
        header = self.request.headers.get(AGENT_HEADER, "").strip()
        query = self.request.query_params.get("as_agent", "").strip()
        if header and query and header != query:
            raise InvalidInput(
                f"The {AGENT_HEADER} header and the as_agent parameter name different agents.",
                details={"fields": {AGENT_HEADER: ["Differs from as_agent."]}},
            )
        name = header or query
        bound = self.request.auth.agent_external_id  # type: ignore[union-attr]
        if bound:
            # A key bound to an agent always acts as that agent: naming another is refused.
            if name and name != bound:
                raise AgentMismatch(
                    f"This API key is bound to agent {bound!r}; it cannot act as {name!r}.",
                    details={"bound_agent": bound, "requested_agent": name},
                )
            name = bound
        if not name:
            if required:
                raise InvalidInput(
                    f"Send the {AGENT_HEADER} header (or ?as_agent=) naming the agent making this call.",
                    details={"fields": {AGENT_HEADER: ["This header is required."]}},
                )
            return None
        return agent_get(tenant=self.tenant, external_id=name)

    def expected_version(self) -> int | None:
        """The version the caller read: the If-Match header or the `expected_version` query parameter."""
        raw = self.request.headers.get("If-Match", "").strip().strip('"').removeprefix("v")
        raw = raw or self.request.query_params.get("expected_version", "").strip()
        if not raw:
            return None
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):  # "²".isdigit(); bigint range
            raise InvalidInput(
                "If-Match must be the version number you read.",
                details={"fields": {"If-Match": ["Not a version."]}},
            )
        return int(raw)


# --- cognitive state ---------------------------------------------------------------------------


def checkpoint_out(checkpoint: Checkpoint, state: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {
        "id": checkpoint.public_id,
        "agent": checkpoint.agent.external_id,
        "seq": checkpoint.seq,
        "reason": checkpoint.reason,
        "step": checkpoint.step,
        "produced_by": checkpoint.produced_by,
        "covers_event_seq": checkpoint.covers_event_seq,
        "schema_version": checkpoint.schema_version,
        "storage": checkpoint.storage,
        "base_seq": checkpoint.base_seq,
        "state_bytes": checkpoint.state_bytes,
        "state_sha256": checkpoint.state_sha256,
        "created_at": checkpoint.created_at.isoformat(),
    }
    if state is not None:
        out["state"] = state
    return out


class CheckpointOutputSerializer(serializers.Serializer):
    """The shape `checkpoint_out` answers (for the schema; `state` only on the detail)."""

    id = serializers.CharField()
    agent = serializers.CharField()
    seq = serializers.IntegerField()
    reason = serializers.CharField()
    step = serializers.IntegerField(allow_null=True)
    produced_by = serializers.CharField()
    covers_event_seq = serializers.IntegerField()
    schema_version = serializers.IntegerField()
    storage = serializers.CharField(help_text="full | delta")
    base_seq = serializers.IntegerField(allow_null=True)
    state_bytes = serializers.IntegerField()
    state_sha256 = serializers.CharField()
    created_at = serializers.DateTimeField()
    state = serializers.JSONField(required=False, help_text="The recorded state (one checkpoint only).")


class CheckpointPageSerializer(serializers.Serializer):
    items = CheckpointOutputSerializer(many=True)
    next = serializers.CharField(allow_null=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Deprecated alias of `next`.")


STATE_OUT = inline_serializer(
    "CognitiveStateOut",
    {
        "agent": serializers.CharField(),
        "schema_version": serializers.IntegerField(),
        "context": serializers.JSONField(help_text="{goal, constraints, …}"),
        "observation": serializers.JSONField(),
        "working_memory": serializers.JSONField(),
        "decision": serializers.JSONField(),
        "tool_state": serializers.JSONField(),
        "checkpoint": serializers.JSONField(help_text="{id, seq} of the latest checkpoint, or null"),
        "version": serializers.IntegerField(),
        "updated_at": serializers.DateTimeField(allow_null=True),
    },
)


class AgentStateApi(AgentScopedView):
    idempotent_optimistic = True  # a hot path: one statement for its Idempotency-Key
    parser_classes = [TextSafeJSONParser, JsonPatchParser]  # PATCH takes application/json-patch+json

    @extend_schema(responses=STATE_OUT, summary="The agent's cognitive state (schema 1)")
    def get(self, request: Any, agent: str) -> Response:
        view = cognition.state_get(tenant=self.tenant, agent=self.agent(agent))
        response = Response(view.as_dict())
        response["ETag"] = f'"{view.version}"'
        return response

    @extend_schema(
        request=FREE_JSON,
        responses=STATE_OUT,
        parameters=[IF_MATCH_PARAM],
        summary="Replace the agent's cognitive state",
        description="Body: {schema_version: 1, context: {goal, constraints}, observation, working_memory, "
        "decision, tool_state}. No schema_version = legacy 0, upgraded. A newer schema_version → 422 "
        "schema_version_unsupported; a wrong type → 400 invalid_state naming the field.",
    )
    def put(self, request: Any, agent: str) -> Response:
        agent_row = self.agent(agent)
        view = cognition.state_put(
            tenant=self.tenant, agent=agent_row, raw=request.data, expected_version=self.expected_version()
        )
        out = view.as_dict()
        if view.upgraded_from is not None:
            out["upgraded_from"] = view.upgraded_from
        return Response(out)

    class PatchSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentStatePatchInput"

        patch = serializers.ListField(
            child=serializers.DictField(), help_text="RFC 6902 operations, paths relative to the state."
        )

    @extend_schema(
        request=PatchSerializer,
        responses=STATE_OUT,
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
        return Response(view.as_dict())


class AgentStateRestoreApi(AgentScopedView):
    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentStateRestoreInput"

        checkpoint = serializers.CharField(help_text="Seq or id (ckpt_…) of the checkpoint to restore.")
        reason = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")

    @extend_schema(
        request=InputSerializer,
        responses={
            201: inline_serializer(
                "StateRestoredOut",
                {"state": serializers.JSONField(), "checkpoint": CheckpointOutputSerializer()},
            )
        },
        summary="Restore the state of a checkpoint (writes a new state and checkpoint; history is kept)",
    )
    def post(self, request: Any, agent: str) -> Response:
        data = self.validate(self.InputSerializer)
        view, checkpoint = cognition.state_restore(
            tenant=self.tenant, agent=self.agent(agent), ref=data["checkpoint"], reason=data["reason"]
        )
        return Response({"state": view.as_dict(), "checkpoint": checkpoint_out(checkpoint)}, status=201)


# --- checkpoints -------------------------------------------------------------------------------


class AgentCheckpointsApi(AgentScopedView):
    idempotent_optimistic = True  # a hot path: one statement for its Idempotency-Key
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentCheckpointsInput"

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
        return Response(result.document)


class AgentReducersApi(AgentScopedView):
    class ReducerSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentReducersReducer"

        event_type = serializers.CharField(max_length=100)
        op = serializers.ChoiceField(choices=["set", "merge", "append"])
        target = serializers.CharField(max_length=200)
        source = serializers.CharField(  # type: ignore[assignment]
            max_length=200, required=False, allow_blank=True, default=""
        )

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentReducersInput"

        reducers = serializers.ListField(child=serializers.DictField(), max_length=100)

    @extend_schema(responses=FREE_JSON, summary="The agent's declared reducers")
    def get(self, request: Any, agent: str) -> Response:
        reducers = recovery.reducers_get(tenant=self.tenant, agent=self.agent(agent))
        return Response({"reducers": [r.as_dict() for r in reducers]})

    @extend_schema(
        responses=FREE_JSON,
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
            items.append(dict(serializer.validated_data))
        reducers = recovery.reducers_put(tenant=self.tenant, agent=self.agent(agent), reducers=items)
        return Response({"reducers": [r.as_dict() for r in reducers]})


# --- task context layers -----------------------------------------------------------------------


class AgentContextViewApi(AgentScopedView):
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
        return Response(layers.context_view(tenant=self.tenant, task=task, agent=agent_row))


class SharedContextSerializer(serializers.Serializer):
    goal = serializers.CharField(required=False, allow_blank=True)
    constraints = serializers.ListField(required=False)
    artifacts = serializers.ListField(required=False)
    decisions = serializers.ListField(required=False)
    dependencies = serializers.ListField(required=False)


class SharedContextPatchSerializer(SharedContextSerializer):
    append = serializers.DictField(
        child=serializers.ListField(), required=False, help_text="Items to append to list fields."
    )

    def validate_append(self, value: dict[str, Any]) -> dict[str, Any]:
        unknown = [key for key in value if key not in layers.SHARED_LIST_FIELDS]
        if unknown:
            raise serializers.ValidationError(f"{unknown[0]!r} is not a list field of the shared context.")
        return value


class TaskSharedContextApi(AgentScopedView):
    agent_binding = False  # shared between the task's agents; acts as the caller

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


class TaskPrivateContextApi(AgentScopedView):
    agent_binding = False  # shared between the task's agents; acts as the caller

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TaskPrivateContextInput"

        data = serializers.DictField(  # type: ignore[assignment]
            help_text="Any JSON object; only the calling agent ever reads it."
        )

    @extend_schema(
        responses=FREE_JSON,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="The calling agent's private context on the task",
    )
    def get(self, request: Any, task_id: str) -> Response:
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        caller = self.caller(required=True)
        assert caller is not None
        return Response(layers.private_context_get(tenant=self.tenant, task=task, agent=caller).__dict__)

    @extend_schema(
        responses=FREE_JSON,
        request=InputSerializer,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM, IF_MATCH_PARAM],
        summary="Replace the calling agent's private context on the task",
    )
    def put(self, request: Any, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        caller = self.caller(required=True)
        assert caller is not None
        view = layers.private_context_put(
            tenant=self.tenant,
            task=task,
            agent=caller,
            data=data["data"],
            expected_version=self.expected_version(),
        )
        return Response(view.__dict__)


class TaskMessagesApi(AgentScopedView):
    agent_binding = False  # shared between the task's agents; acts as the caller
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    class InputSerializer(serializers.Serializer):
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
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        caller = self.caller(required=True)
        assert caller is not None
        queryset = layers.ipc_list(
            tenant=self.tenant, task=task, agent=caller, box=data["box"], unread_only=data["unread"]
        )
        rows, next_cursor = keyset_page(
            queryset, cursor=data.get("cursor"), limit=data.get("limit"), newest_first=False
        )
        items = [layers.ipc_dict(m) for m in rows]
        return Response({"items": items, "next": next_cursor, "next_cursor": next_cursor})

    @extend_schema(
        responses=FREE_JSON,
        request=InputSerializer,
        parameters=[AGENT_HEADER_PARAM, AS_AGENT_PARAM],
        summary="Send a message on the task",
    )
    def post(self, request: Any, task_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        sender = self.caller(required=True)
        assert sender is not None
        recipient = agent_get(tenant=self.tenant, external_id=data["to"]) if data["to"] else None
        message = layers.ipc_send(
            tenant=self.tenant, task=task, sender=sender, recipient=recipient, body=data["body"]
        )
        return Response(layers.ipc_dict(message), status=201)


class TaskMessagesReadApi(AgentScopedView):
    agent_binding = False  # shared between the task's agents; acts as the caller

    class InputSerializer(serializers.Serializer):
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
        task = layers.task_get(tenant=self.tenant, task_id=task_id)
        caller = self.caller(required=True)
        assert caller is not None
        count = layers.ipc_mark_read(tenant=self.tenant, task=task, agent=caller, message_ids=data["ids"])
        return Response({"marked_read": count})


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
