"""Output shapes: one serializer per aggregate, used for every response that shows it.

Sessions, messages, tasks, events and checkpoints are rendered here and nowhere else: the API
views, the MCP server and the recovered-state document (which shows parts of a session, its
messages, a checkpoint and events) all go through these serializers, so the shapes cannot drift.
Services return models and dataclasses; they never import this module (docs/architecture.md).
"""

from __future__ import annotations

import copy
from typing import Any, cast

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from memory.models import Checkpoint, Event, Message, Session, SessionStatus, Task, TaskStatus, ValueTier
from memory.services.cognition import StateView
from memory.services.recovery import (
    EventsAfterCheckpoint,
    RecoveredCheckpoint,
    RecoveredSession,
    RecoveredState,
)
from memory.services.state_fold import Reducer


def fields_of(
    serializer: type[serializers.Serializer], name: str, *names: str
) -> type[serializers.Serializer]:
    """A serializer named `name` with only the fields `names` of `serializer`, in that order: the
    part of an aggregate's shape that a larger document shows."""
    declared = serializer._declared_fields
    part = cast(
        type[serializers.Serializer],
        type(name, (serializers.Serializer,), {n: copy.deepcopy(declared[n]) for n in names}),
    )
    part._declared_fields = {n: part._declared_fields[n] for n in names}
    return part


class IsoDateTimeField(serializers.DateTimeField):
    """A date-time as Python's isoformat() (`+00:00`, as this API always answered), not DRF's `Z`."""

    def to_representation(self, value: Any) -> str:  # None never reaches it: the serializer emits null
        return str(value.isoformat())


class SessionOutputSerializer(serializers.Serializer):
    id = serializers.CharField(
        source="public_id", help_text="`sess_` + 24 hex characters (gen_ai.conversation.id)."
    )
    agent = serializers.CharField(
        source="agent.external_id", help_text="The agent's external id (gen_ai.agent.id)."
    )
    key = serializers.CharField(allow_null=True, help_text="The application's own id for it, if given.")
    user_id = serializers.CharField()
    model = serializers.CharField(source="model_name", help_text="gen_ai.request.model")
    metadata = serializers.DictField()
    status = serializers.ChoiceField(choices=SessionStatus.choices)
    created_at = IsoDateTimeField()
    last_accessed_at = IsoDateTimeField()
    expires_at = IsoDateTimeField(allow_null=True, help_text="Idle expiry; moves on every agent access.")
    ended_at = IsoDateTimeField(allow_null=True)
    idle_ttl_seconds = serializers.IntegerField()
    last_seq = serializers.IntegerField(
        source="message_seq", help_text="The seq of the newest message (0 when empty)."
    )
    message_count = serializers.IntegerField()
    token_count = serializers.IntegerField()


class MessageOutputSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    role = serializers.CharField()
    content = serializers.CharField()
    token_count = serializers.IntegerField()
    turn_id = serializers.CharField()
    tool_call_id = serializers.CharField()
    tool_calls = serializers.ListField(child=serializers.DictField())
    event_kind = serializers.CharField()
    parent_seq = serializers.IntegerField(allow_null=True)
    artifact_refs = serializers.ListField()
    metadata = serializers.DictField()
    created_at = IsoDateTimeField()
    name = serializers.CharField(help_text="The speaker (indexed for search with the content).")
    occurred_at = IsoDateTimeField(help_text="When it was said (client-supplied, else append time).")


class TaskOutputSerializer(serializers.Serializer):
    id = serializers.CharField(source="public_id")
    session = serializers.CharField(source="session.public_id", allow_null=True)
    agent = serializers.CharField(source="agent.external_id", allow_null=True)
    user_id = serializers.CharField()
    title = serializers.CharField()
    input = serializers.CharField()
    output = serializers.CharField()
    status = serializers.ChoiceField(choices=TaskStatus.choices)
    value_tier = serializers.ChoiceField(choices=ValueTier.choices)
    metadata = serializers.DictField()
    created_at = IsoDateTimeField()
    updated_at = IsoDateTimeField()
    finished_at = IsoDateTimeField(allow_null=True)
    expires_at = IsoDateTimeField(allow_null=True)


class EventOutputSerializer(serializers.Serializer):
    id = serializers.CharField(source="public_id")
    stream = serializers.CharField()
    seq = serializers.IntegerField()
    type = serializers.CharField()
    session = serializers.SerializerMethodField()
    payload = serializers.DictField()
    created_at = IsoDateTimeField()

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_session(self, event: Event) -> str | None:
        return event.payload.get("gen_ai.conversation.id")


def session_out(session: Session) -> dict[str, Any]:
    """A session as every endpoint (and the MCP server) answers it."""
    return SessionOutputSerializer(session).data


def message_out(message: Message) -> dict[str, Any]:
    return MessageOutputSerializer(message).data


def task_out(task: Task) -> dict[str, Any]:
    return TaskOutputSerializer(task).data


def event_out(event: Event) -> dict[str, Any]:
    return EventOutputSerializer(event).data


class CheckpointOutputSerializer(serializers.Serializer):
    """The shape `checkpoint_out` answers (for the schema; `state` only on the detail)."""

    id = serializers.CharField(source="public_id")
    agent = serializers.CharField(source="agent.external_id")
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
    created_at = IsoDateTimeField()
    state = serializers.JSONField(required=False, help_text="The recorded state (one checkpoint only).")


def checkpoint_out(checkpoint: Checkpoint, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint; with `state`, the state it recorded (the model has no `state`: left out)."""
    data = dict(CheckpointOutputSerializer(checkpoint).data)
    if state is not None:
        data["state"] = state
    return data


class CheckpointPageSerializer(serializers.Serializer):
    items = CheckpointOutputSerializer(many=True)
    next = serializers.CharField(allow_null=True)
    next_cursor = serializers.CharField(allow_null=True, help_text="Deprecated alias of `next`.")


# --- an agent's cognitive state and its reducers ------------------------------------------------


@extend_schema_serializer(component_name="CognitiveStateOut")
class StateViewSerializer(serializers.Serializer):
    """An agent's cognitive state: the document's own fields (in its stored order, numbers as
    stored) between the state's identity and its version."""

    agent = serializers.CharField()
    schema_version = serializers.IntegerField()
    context = serializers.JSONField(help_text="{goal, constraints, …}")  # type: ignore[assignment]  # a field, not Serializer.context
    observation = serializers.JSONField()
    working_memory = serializers.JSONField()
    decision = serializers.JSONField()
    tool_state = serializers.JSONField()
    checkpoint = serializers.JSONField(help_text="{id, seq} of the latest checkpoint, or null")
    version = serializers.IntegerField()
    updated_at = IsoDateTimeField(allow_null=True)
    upgraded_from = serializers.IntegerField(
        required=False, help_text="Only on a write of an older schema: the schema it came in as."
    )

    def to_representation(self, view: StateView) -> dict[str, Any]:
        data: dict[str, Any] = {
            "agent": view.agent,
            "schema_version": view.schema_version,
            **view.document,
            "checkpoint": view.checkpoint,
            "version": view.version,
            "updated_at": view.updated_at.isoformat() if view.updated_at else None,
        }
        if view.upgraded_from is not None:
            data["upgraded_from"] = view.upgraded_from
        return data


def state_out(view: StateView) -> dict[str, Any]:
    """An agent's cognitive state, as the state endpoints and the recovered state show it."""
    return StateViewSerializer(view).data


class ReducerSerializer(serializers.Serializer):
    event_type = serializers.CharField(help_text="An `agent.*` event type.")
    op = serializers.ChoiceField(choices=["set", "merge", "append"])
    target = serializers.CharField(help_text="A dotted path in the custom state.")
    source = serializers.CharField(  # type: ignore[assignment]
        allow_blank=True, help_text='A dotted path in the payload; "" = all of it.'
    )


class ReducersSerializer(serializers.Serializer):
    reducers = ReducerSerializer(many=True)


def reducers_out(reducers: list[Reducer]) -> dict[str, Any]:
    return ReducersSerializer({"reducers": reducers}).data


# --- the recovered state: parts of the aggregates above -----------------------------------------

RecoveredSessionFields = fields_of(
    SessionOutputSerializer,
    "RecoveredSessionFields",
    "id",
    "status",
    "user_id",
    "model",
    "message_count",
    "last_accessed_at",
)
RecoveredMessageSerializer = fields_of(
    MessageOutputSerializer,
    "RecoveredMessage",
    "seq",
    "role",
    "content",
    "turn_id",
    "tool_call_id",
    "tool_calls",
    "event_kind",
    "created_at",
)
RecoveredCheckpointFields = fields_of(
    CheckpointOutputSerializer,
    "RecoveredCheckpointFields",
    "id",
    "seq",
    "reason",
    "step",
    "produced_by",
    "covers_event_seq",
    "schema_version",
    "storage",
    "state_bytes",
    "created_at",
)
RecoveredEventSerializer = fields_of(
    EventOutputSerializer, "RecoveredEvent", "id", "seq", "type", "payload", "created_at"
)


def _recovered_session(part: RecoveredSession | None) -> dict[str, Any] | None:
    if part is None:
        return None
    return {
        **RecoveredSessionFields(part.session).data,
        "messages": RecoveredMessageSerializer(part.messages, many=True).data,
    }


def _recovered_checkpoint(part: RecoveredCheckpoint | None) -> dict[str, Any] | None:
    if part is None:
        return None
    data = dict(RecoveredCheckpointFields(part.checkpoint).data)
    data["schema_version"] = part.schema_version
    data["state"] = part.state
    return data


def _events_after(part: EventsAfterCheckpoint | None) -> dict[str, Any] | None:
    if part is None:
        return None
    return {
        "after_seq": part.after_seq,
        "truncated": part.truncated,
        "items": RecoveredEventSerializer(part.items, many=True).data,
    }


def recovered_state_out(result: RecoveredState) -> dict[str, Any]:
    """The recovered-state document, as GET /agents/{agent}/recovered-state and the MCP tool answer it."""
    return {
        "agent": result.agent.external_id,
        "generated_at": result.generated_at.isoformat(),
        "operational": result.operational,
        "checkpoint": _recovered_checkpoint(result.checkpoint),
        "state": None if result.state is None else state_out(result.state),
        "session": _recovered_session(result.session),
        "tasks": result.tasks,
        "events_after_checkpoint": _events_after(result.events_after_checkpoint),
        "inbox": result.inbox,
        "warnings": result.warnings,
        "parts": result.parts,
    }
