"""A span's messages, from whichever convention it uses (GenAI semconv JSON, OpenLLMetry's
indexed attributes, span events), as the MessageInputs a session records. Pure."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from memory.models import MessageRole
from memory.services import sessions
from memory.services.otel_ingest.attributes import as_text, attributes_dict, json_value

ROLE_ALIASES = {
    "system": MessageRole.SYSTEM,
    "developer": MessageRole.SYSTEM,
    "user": MessageRole.USER,
    "human": MessageRole.USER,
    "assistant": MessageRole.ASSISTANT,
    "ai": MessageRole.ASSISTANT,
    "model": MessageRole.ASSISTANT,
    "tool": MessageRole.TOOL,
    "function": MessageRole.TOOL,
}
EVENT_ROLES = {
    "gen_ai.system.message": MessageRole.SYSTEM,
    "gen_ai.user.message": MessageRole.USER,
    "gen_ai.assistant.message": MessageRole.ASSISTANT,
    "gen_ai.tool.message": MessageRole.TOOL,
    "gen_ai.choice": MessageRole.ASSISTANT,
}
INDEXED = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any] | None:
    if not name:
        return None
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {
        "id": str(call_id or f"call_{hashlib.sha1(f'{name}{arguments}'.encode()).hexdigest()[:12]}"),
        "type": "function",
        "function": {"name": str(name), "arguments": arguments},
    }


def _role(value: Any) -> str:
    return ROLE_ALIASES.get(str(value or "").lower(), MessageRole.USER)


def _message(
    role: str, content: str, *, tool_calls: list[dict[str, Any]] | None = None, tool_call_id: str = ""
) -> sessions.MessageInput:
    limit = settings.CTXAPP.message_max_bytes
    metadata: dict[str, Any] = {}
    if len(content.encode()) > limit:
        content = content.encode()[:limit].decode("utf-8", "ignore")
        metadata["truncated"] = True
    if role == MessageRole.TOOL and not tool_call_id:
        role = MessageRole.USER  # a tool result that names no call cannot be a tool message
    return sessions.MessageInput(
        role=role,
        content=content,
        tool_calls=(tool_calls or []) if role == MessageRole.ASSISTANT else [],
        tool_call_id=tool_call_id[:200] if role == MessageRole.TOOL else "",
        metadata=metadata,
    )


@dataclass
class _Body:
    """What a message's parts and OpenAI-style fields say, in the order they say it."""

    texts: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    tool_response_id: str | None = None  # set by a tool_call_response part: a tool message


def _parts_read(parts: Any, body: _Body) -> None:
    """Semconv message parts: text and reasoning, tool calls, a tool call's response."""
    for part in parts:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" or kind == "reasoning":
            body.texts.append(as_text(part.get("content")))
        elif kind == "tool_call":
            _tool_call_add(body.calls, part.get("id"), part.get("name"), part.get("arguments"))
        elif kind == "tool_call_response":
            body.tool_response_id = str(part.get("id") or "")
            body.texts.append(as_text(part.get("response") if "response" in part else part.get("result")))
        elif "content" in part:
            body.texts.append(as_text(part.get("content")))


def _content_texts(content: Any) -> list[str]:
    """OpenAI's `content`: a string, or a list of content parts."""
    if isinstance(content, list):
        return [as_text(p.get("text") if isinstance(p, dict) else p) for p in content]
    return [as_text(content)]


def _openai_tool_calls_read(raw_calls: Any, body: _Body) -> None:
    """OpenAI's `tool_calls` ({id, function: {name, arguments}} or flat), JSON-encoded or not."""
    for raw in json_value(raw_calls) or []:
        if isinstance(raw, dict):
            function: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else raw
            _tool_call_add(body.calls, raw.get("id"), function.get("name"), function.get("arguments"))


def _tool_call_add(calls: list[dict[str, Any]], call_id: Any, name: Any, arguments: Any) -> None:
    call = _tool_call(call_id, name, arguments)
    if call:
        calls.append(call)


def _from_parts_message(entry: Any) -> sessions.MessageInput | None:
    """One message of `gen_ai.input.messages` / `gen_ai.output.messages` (parts), or an
    OpenAI-style {role, content, tool_calls, tool_call_id} object."""
    if not isinstance(entry, dict):
        return None
    role = _role(entry.get("role"))
    tool_call_id = str(entry.get("tool_call_id") or entry.get("id") or "") if role == MessageRole.TOOL else ""
    body = _Body()
    _parts_read(entry.get("parts") or [], body)
    if body.tool_response_id is not None:
        role, tool_call_id = MessageRole.TOOL, body.tool_response_id
    if "content" in entry:
        body.texts.extend(_content_texts(entry["content"]))
    _openai_tool_calls_read(entry.get("tool_calls"), body)
    choice = json_value(entry.get("message"))
    if isinstance(choice, dict):  # a gen_ai.choice body
        return _from_parts_message({"role": "assistant", **choice})
    text = "\n".join(t for t in body.texts if t)
    return _message(role, text, tool_calls=body.calls, tool_call_id=tool_call_id)


def _indexed_messages(attrs: dict[str, Any], kind: str) -> list[sessions.MessageInput]:
    """OpenLLMetry's flattened `gen_ai.prompt.N.role` / `.content` / `.tool_calls.M.name` …"""
    rows: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        match = INDEXED.match(key)
        if match and match.group(1) == kind:
            rows.setdefault(int(match.group(2)), {})[match.group(3)] = value
    result = []
    for _, row in sorted(rows.items()):
        calls: dict[int, dict[str, Any]] = {}
        for key, value in row.items():
            parts = key.split(".")
            if len(parts) == 3 and parts[0] == "tool_calls" and parts[1].isdigit():
                calls.setdefault(int(parts[1]), {})[parts[2]] = value
        tool_calls = [
            call
            for _, raw in sorted(calls.items())
            if (call := _tool_call(raw.get("id"), raw.get("name"), raw.get("arguments")))
        ]
        default_role = "assistant" if kind == "completion" else "user"
        result.append(
            _message(
                _role(row.get("role") or default_role),
                as_text(row.get("content")),
                tool_calls=tool_calls,
                tool_call_id=as_text(row.get("tool_call_id")),
            )
        )
    return result


def _event_messages(span: Span) -> tuple[list[sessions.MessageInput], list[sessions.MessageInput]]:
    """(inputs, outputs) of the event-based convention. Only `gen_ai.choice` is the call's output:
    `gen_ai.assistant.message` is history re-sent as input (its tool calls were recorded when they
    were a choice), so it is de-duplicated like any input, in the order it was sent."""
    inputs: list[sessions.MessageInput] = []
    outputs: list[sessions.MessageInput] = []
    for event in span.events:
        role = EVENT_ROLES.get(event.name)
        if role is None:
            continue
        attrs = attributes_dict(event.attributes)
        body = json_value(attrs.get("gen_ai.event.content") or attrs.get("event.body") or attrs.get("body"))
        data = body if isinstance(body, dict) else attrs
        message = _from_parts_message({"role": role, **{k: v for k, v in data.items() if k != "role"}})
        if message is not None:
            (outputs if event.name == "gen_ai.choice" else inputs).append(message)
    return inputs, outputs


def span_messages(
    attrs: dict[str, Any], span: Span, operation: str, span_hex: str
) -> tuple[list[sessions.MessageInput], list[sessions.MessageInput]]:
    """(inputs, outputs) of a span, from whichever convention it uses. Pure."""
    inputs: list[sessions.MessageInput] = []
    outputs: list[sessions.MessageInput] = []
    system = json_value(attrs.get("gen_ai.system_instructions"))
    if isinstance(system, list):
        text = "\n".join(as_text(p.get("content")) if isinstance(p, dict) else as_text(p) for p in system)
        inputs.append(_message(MessageRole.SYSTEM, text))
    elif isinstance(system, str) and system:
        inputs.append(_message(MessageRole.SYSTEM, system))
    for key, target in (("gen_ai.input.messages", inputs), ("gen_ai.output.messages", outputs)):
        value = json_value(attrs.get(key))
        if isinstance(value, list):
            target.extend(m for m in map(_from_parts_message, value) if m is not None)
    if not inputs and not outputs:
        inputs = _indexed_messages(attrs, "prompt")
        outputs = _indexed_messages(attrs, "completion")
    if not inputs and not outputs:
        inputs, outputs = _event_messages(span)
    if operation == "execute_tool" and not outputs:
        call_id = as_text(attrs.get("gen_ai.tool.call.id")) or f"otel-{span_hex}"
        result = attrs.get("gen_ai.tool.call.result", attrs.get("gen_ai.tool.output"))
        outputs.append(_message(MessageRole.TOOL, as_text(result), tool_call_id=call_id))
        inputs = []  # the tool's arguments are the assistant's tool call, already recorded
    return inputs, outputs


def fingerprint(role: str, content: str, tool_call_id: str, tool_calls: list[dict[str, Any]]) -> str:
    if role == MessageRole.TOOL:
        return f"tool\0{tool_call_id}"  # a tool answer is known by its call, whatever it returned
    ids = ",".join(str(c.get("id", "")) for c in tool_calls) if tool_calls else ""
    return f"{role}\0{content}\0{ids}"
