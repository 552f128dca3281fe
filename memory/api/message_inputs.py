"""Validation of appended messages at the edge: DRF input serializers → MessageInput dataclasses.

One message (`MessageInputSerializer`) or a batch `{"messages": [...]}` (`message_inputs_validate`).
Every bad field is named (`messages[3].role` in a batch), so a batch with one bad message is
refused whole, before any write. The fields are strict (JSON types as sent, no coercion of
`"5"` to 5) and their messages tell the client how to fix the body.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import serializers

from memory.api.base import MAX_BIGINT, json_size_error
from memory.exceptions import InvalidInput
from memory.models import MessageRole
from memory.services.sessions import MessageInput

ROLES = tuple(sorted(MessageRole.values))
# A client-supplied occurred_at may lie at most this far ahead of the server's clock.
OCCURRED_AT_MAX_FUTURE = timedelta(days=1)
NON_FIELD = "non_field_errors"


class RoleField(serializers.ChoiceField):
    def __init__(self, **kwargs: Any) -> None:
        missing = f"Must be one of {', '.join(ROLES)}; got None."
        super().__init__(choices=ROLES, error_messages={"required": missing, "null": missing}, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str) or data not in ROLES:  # a dict or list is unhashable: type first
            raise serializers.ValidationError(f"Must be one of {', '.join(ROLES)}; got {data!r}.")
        return data


class StrictCharField(serializers.CharField):
    """A JSON string as sent (no trimming, no coercion); null counts as ""."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, allow_blank=True, allow_null=True, trim_whitespace=False, **kwargs)
        self.validators = []  # the bounds are checked in to_internal_value, with our messages

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            raise serializers.ValidationError("Must be a string.")
        if self.max_length is not None and len(data) > self.max_length:
            raise serializers.ValidationError(f"Must be at most {self.max_length} characters.")
        return data


def message_size_check(text: str) -> str:
    """`text`, if it fits a message (CTXAPP_MESSAGE_MAX_BYTES of UTF-8), else ValidationError."""
    limit = settings.CTXAPP.message_max_bytes
    # Cheap bound first: a UTF-8 character is at most 4 bytes.
    if len(text) * 4 > limit and len(text.encode()) > limit:
        raise serializers.ValidationError(
            f"Is longer than the limit of {limit} bytes (UTF-8); split it or store it as an artifact."
        )
    return text


class ContentField(StrictCharField):
    @property
    def max_bytes(self) -> int:
        """The bound in UTF-8 bytes (the MCP tools' schemas state it: ctxapp/mcp/bounds.py)."""
        return int(settings.CTXAPP.message_max_bytes)

    def to_internal_value(self, data: Any) -> str:
        return message_size_check(super().to_internal_value(data))


class MessageTextField(serializers.CharField):
    """Text that stands for a message (a context build's upcoming input): bounded as one."""

    max_bytes = ContentField.max_bytes

    def to_internal_value(self, data: Any) -> str:
        return message_size_check(super().to_internal_value(data))


def tool_calls_errors(value: Any) -> list[str]:
    """What is wrong with a list of OpenAI-style tool calls (empty when nothing is)."""
    if not isinstance(value, list):
        return ["Must be a list of tool calls: [{id, type: 'function', function: {name, arguments}}]."]
    errors: list[str] = []
    for index, call in enumerate(value):
        errors.extend(f"Item {index}{problem}" for problem in _tool_call_problems(call))
    return errors


def _tool_call_problems(call: Any) -> list[str]:
    if not isinstance(call, dict):
        return [" must be an object {id, type, function}."]
    problems = []
    if not isinstance(call.get("id"), str) or not call["id"]:
        problems.append(": 'id' must be a non-empty string.")
    if call.get("type") != "function":
        problems.append(": 'type' must be 'function'.")
    function = call.get("function")
    if not isinstance(function, dict):
        return [*problems, ": 'function' must be an object {name, arguments}."]
    if not isinstance(function.get("name"), str) or not function["name"]:
        problems.append(": 'function.name' must be a non-empty string.")
    if not isinstance(function.get("arguments"), str | dict):
        problems.append(": 'function.arguments' must be a JSON string (or an object).")
    return problems


def _json_bounded(value: Any) -> Any:
    """A message's free JSON value, bounded like every request field's (CTXAPP_MAX_JSON_FIELD_BYTES)."""
    error = json_size_error(value)
    if error is not None:
        raise serializers.ValidationError(error)
    return value


class ToolCallsField(serializers.ListField):
    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        errors = tool_calls_errors(data)
        if errors:
            raise serializers.ValidationError(errors)
        return list(data)


class StrictListField(serializers.ListField):
    def to_internal_value(self, data: Any) -> list[Any]:
        if not isinstance(data, list):
            raise serializers.ValidationError("Must be a list.")
        return _json_bounded(data)


class StrictDictField(serializers.DictField):
    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be an object.")
        return _json_bounded(data)


class SeqField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int) or not 1 <= data <= MAX_BIGINT:
            raise serializers.ValidationError(
                "Must be a positive integer (the seq of an earlier message) or null."
            )
        return data


def occurred_at_parse(value: Any) -> datetime:
    """An ISO 8601 timestamp with a time zone → an aware datetime, or ValidationError."""
    if not isinstance(value, str):
        raise serializers.ValidationError(
            "Must be an ISO 8601 date-time string with a time zone, e.g. 2023-05-08T13:56:00Z."
        )
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise serializers.ValidationError(f"Not an ISO 8601 date-time: {value[:40]!r}.") from None
    if parsed.tzinfo is None:
        raise serializers.ValidationError("Must carry a time zone (Z or +hh:mm).")
    if parsed > timezone.now() + OCCURRED_AT_MAX_FUTURE:
        raise serializers.ValidationError("Must not lie more than a day in the future.")
    return parsed


class OccurredAtField(serializers.DateTimeField):
    def to_internal_value(self, value: Any) -> datetime:
        return occurred_at_parse(value)


class MessageInputSerializer(serializers.Serializer):
    """One message as appended; `.validated_data` is a MessageInput."""

    role = RoleField()
    content = ContentField(
        help_text="Required (non-empty) for roles `user` and `system`, and for `assistant` "
        "without tool_calls."
    )
    turn_id = StrictCharField(max_length=200)
    tool_call_id = StrictCharField(max_length=200, help_text="Required for role `tool`.")
    tool_calls = ToolCallsField(
        child=serializers.DictField(),
        required=False,
        allow_null=True,
        help_text="[{id, type: 'function', function: {name, arguments}}]",
    )
    event_kind = StrictCharField(max_length=64)
    parent_seq = SeqField(required=False, allow_null=True, min_value=1, max_value=MAX_BIGINT)
    artifact_refs = StrictListField(required=False, allow_null=True)
    metadata = StrictDictField(required=False, allow_null=True)
    name = StrictCharField(max_length=200, help_text="The speaker; searchable.")
    occurred_at = OccurredAtField(
        required=False,
        allow_null=True,
        help_text="When it was said (ISO 8601 with a time zone; default: now). For imports.",
    )

    def to_internal_value(self, data: Any) -> MessageInput:
        errors = {
            name: [f"Unknown field. Known: {', '.join(sorted(self.fields))}."]
            for name in sorted(data.keys() - self.fields.keys())
        }
        values: dict[str, Any] = {}
        try:
            values = dict(super().to_internal_value(data))
        except serializers.ValidationError as exc:
            assert isinstance(exc.detail, dict)
            errors.update({name: [str(m) for m in messages] for name, messages in exc.detail.items()})
        for name, message in _cross_field_errors(data, errors):
            errors.setdefault(name, []).append(message)
        if errors:
            raise serializers.ValidationError(errors)
        return MessageInput(**{name: value for name, value in values.items() if value is not None})


def _cross_field_errors(data: dict[str, Any], errors: dict[str, list[str]]) -> list[tuple[str, str]]:
    """Rules between fields, checked where the fields themselves are valid."""
    if "role" in errors:
        return []
    role, found = data.get("role"), []
    if role != MessageRole.ASSISTANT and data.get("tool_calls") and "tool_calls" not in errors:
        found.append(("tool_calls", "Only an assistant message may carry tool calls."))
    if role == MessageRole.TOOL and not data.get("tool_call_id") and "tool_call_id" not in errors:
        found.append(("tool_call_id", "A tool message must name the tool call it answers (tool_call_id)."))
    # A turn says something: only an assistant's call of tools, and a tool's answer, may be empty.
    if not data.get("content") and "content" not in errors:
        if role in (MessageRole.USER, MessageRole.SYSTEM):
            found.append(("content", f"A {role} message needs content (a non-empty string)."))
        elif role == MessageRole.ASSISTANT and not data.get("tool_calls"):
            found.append(("content", "An assistant message needs content, or tool_calls."))
    return found


# One bound instance validates every message: building a serializer deep-copies its declared
# fields (≈3 ms for this one), which would dominate a 1,000-message batch. Validation keeps no
# per-call state on the serializer or its fields, so sharing the instance is safe across threads.
_MESSAGE_VALIDATOR = MessageInputSerializer()


def message_input_errors(data: Any, prefix: str = "") -> tuple[MessageInput | None, dict[str, list[str]]]:
    """One message → (MessageInput, {}) or (None, errors by field path, each prefixed)."""
    if not isinstance(data, dict):
        return None, {prefix.rstrip(".") or NON_FIELD: ["Must be a message object."]}
    try:
        return _MESSAGE_VALIDATOR.run_validation(data), {}
    except serializers.ValidationError as exc:
        assert isinstance(exc.detail, dict)
        return None, {prefix + name: [str(m) for m in messages] for name, messages in exc.detail.items()}


def _refuse(errors: dict[str, list[str]]) -> InvalidInput:
    first = next(iter(errors))
    return InvalidInput(f"{first}: {errors[first][0]}", details={"fields": errors})


def _batch_validate(data: dict[str, Any]) -> list[MessageInput]:
    extra = data.keys() - {"messages"}
    if extra:
        raise InvalidInput(
            "A batch body has only the 'messages' key.",
            details={"fields": {name: ["Unknown field in a batch body."] for name in sorted(extra)}},
        )
    raw = data["messages"]
    limit = settings.CTXAPP.batch_max_messages
    if not isinstance(raw, list) or not raw:
        raise InvalidInput(
            "'messages' must be a non-empty list of messages.",
            details={"fields": {"messages": ["Must be a non-empty list."]}},
        )
    if len(raw) > limit:
        raise InvalidInput(
            f"A batch holds at most {limit} messages; got {len(raw)}. Split it.",
            details={"fields": {"messages": [f"At most {limit} messages per batch."]}, "limit": limit},
        )
    items: list[MessageInput] = []
    errors: dict[str, list[str]] = {}
    for index, entry in enumerate(raw):
        item, item_errors = message_input_errors(entry, prefix=f"messages[{index}].")
        errors.update(item_errors)
        if item is not None:
            items.append(item)
    if errors:
        raise _refuse(errors)
    return items


def message_inputs_validate(data: Any) -> tuple[list[MessageInput], bool]:
    """An append body: one message object, or {"messages": [...]}. Returns (items, is_batch).

    Raises InvalidInput (422 `validation_error`) naming every bad field. Pure: no database.
    """
    if isinstance(data, dict) and "messages" in data:
        return _batch_validate(data), True
    item, errors = message_input_errors(data)
    if item is None:
        raise _refuse(errors)
    return [item], False
