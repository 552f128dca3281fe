"""OpenTelemetry ingest: OTLP trace batches that follow the GenAI semantic conventions become
sessions, messages (with tool calls), token-usage reports and events.

The wire format is decoded by the `opentelemetry-proto` package (protobuf classes, and
`google.protobuf.json_format` for OTLP/JSON); this module only maps decoded spans.

Mapping (docs/integrations.md, "OpenTelemetry traces"):
- agent: `gen_ai.agent.name` or `gen_ai.agent.id` of the span, else of any span of its trace in
  the same batch or recorded before, else the resource's `service.name`, else `otel`;
- session: `gen_ai.conversation.id` (or OpenInference's `session.id`) of the span or its trace,
  else the trace id; one ctxapp session per (tenant, agent, conversation), opened on first sight
  (and reopened as a new session if the previous one was ended or expired);
- messages: `gen_ai.system_instructions`, `gen_ai.input.messages`, `gen_ai.output.messages`
  (JSON), OpenLLMetry's `gen_ai.prompt.N.*` / `gen_ai.completion.N.*`, or span events
  (`gen_ai.system.message`, `gen_ai.user.message`, `gen_ai.assistant.message`,
  `gen_ai.tool.message`, `gen_ai.choice`); an `execute_tool` span becomes a tool message answering
  `gen_ai.tool.call.id`. Input messages are the whole history on every call, so an input message
  already recorded in the session is not recorded again (counted per role/content/tool call id);
- OpenInference attributes (`openinference.span.kind`, `llm.input_messages.N.message.*`, …) are
  read as their GenAI equivalents (_from_openinference);
- usage: `gen_ai.usage.input_tokens` / `output_tokens` (or the older `prompt_tokens` /
  `completion_tokens`) → a TokenUsageReport (no context build: not used for calibration) and a
  `usage.reported` event;
- events: one `otel.<operation>` event per span on the agent's stream.

Idempotent on (trace id, span id) per tenant: a span already recorded is skipped.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from memory.exceptions import AgentMismatch, DomainError, InvalidInput
from memory.models import (
    Agent,
    Message,
    MessageRole,
    OtelConversation,
    OtelSpan,
    Session,
    SessionStatus,
    Tenant,
    TokenUsageReport,
)
from memory.services import recorder, sessions

DEFAULT_AGENT = "otel"
CONVERSATION_ID_MAX_LENGTH = 255
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
OPERATION_NAME = re.compile(r"[^a-z0-9_]+")


class OtlpUnsupportedMediaType(DomainError):
    code, http_status = "unsupported_media_type", 415
    default_message = "Send OTLP as application/x-protobuf or application/json."


class OtlpMalformed(DomainError):
    code, http_status = "otlp_malformed", 400
    default_message = "The body is not an OTLP ExportTraceServiceRequest."


@dataclass
class IngestResult:
    """What a batch did: spans recorded, already recorded (skipped), rejected (with reasons)."""

    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if len(self.errors) < 20:
            self.errors.append(reason)


# --- decoding ---------------------------------------------------------------------------------


def _hex_ids_to_base64(value: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where proto3's JSON mapping expects base64."""
    if isinstance(value, list):
        return [_hex_ids_to_base64(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"} and (
            isinstance(item, str)
        ):
            # not hex: left for json_format to refuse (or a base64 sender to pass)
            with contextlib.suppress(ValueError):
                item = base64.b64encode(bytes.fromhex(item)).decode()
        out[key] = _hex_ids_to_base64(item)
    return out


def traces_request_decode(*, body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Decode an OTLP/HTTP export body (already decompressed). Pure.

    Raises OtlpUnsupportedMediaType (415) for another content type and OtlpMalformed (400) for a
    body that does not decode.
    """
    media = content_type.split(";")[0].strip().lower()
    request = ExportTraceServiceRequest()
    if media == "application/x-protobuf":
        try:
            request.ParseFromString(body)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise OtlpMalformed(
                f"The body is not an OTLP ExportTraceServiceRequest (protobuf): {exc}."
            ) from None
        return request
    if media == "application/json":
        try:
            data = json.loads(body)
            json_format.ParseDict(_hex_ids_to_base64(data), request, ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError, TypeError, AttributeError, RecursionError) as exc:
            raise OtlpMalformed(f"The body is not an OTLP ExportTraceServiceRequest (JSON): {exc}.") from None
        return request
    raise OtlpUnsupportedMediaType(
        f"Content-Type {media or '(none)'} is not OTLP: send application/x-protobuf or application/json.",
        details={"content_type": media},
    )


def traces_response_encode(*, result: IngestResult, content_type: str) -> bytes:
    """The OTLP ExportTraceServiceResponse for `result`, in the request's encoding. Pure."""
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = "; ".join(result.errors)[:2000]
    if content_type.split(";")[0].strip().lower() == "application/x-protobuf":
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


# --- attribute values -------------------------------------------------------------------------


def _clean_text(text: str) -> str:
    # PostgreSQL text holds no NUL and JSON may carry lone surrogates: neither is storable.
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as a plain Python value (bytes as base64 text). Pure."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _clean_text(value.string_value)
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value if math.isfinite(value.double_value) else str(value.double_value)
    if kind == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_dict(value.kvlist_value.values)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return None


def attributes_dict(items: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in items:
        assert isinstance(item, KeyValue)
        result[_clean_text(item.key)] = any_value(item.value)
    return result


def _clean_value(value: Any) -> Any:
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, list):
        return [_clean_value(item) for item in value]
    if isinstance(value, dict):
        return {_clean_text(str(key)): _clean_value(item) for key, item in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


OPENINFERENCE_OPERATIONS = {
    "LLM": "chat",
    "TOOL": "execute_tool",
    "AGENT": "invoke_agent",
    "EMBEDDING": "embeddings",
    "RETRIEVER": "retrieve",
    "RERANKER": "rerank",
    "CHAIN": "chain",
    "GUARDRAIL": "guardrail",
    "EVALUATOR": "evaluate",
}
OPENINFERENCE_MESSAGE = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
OPENINFERENCE_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(id|function\.name|function\.arguments)$")


def _from_openinference(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenInference's attributes (Arize Phoenix instrumentations) in GenAI terms: the span kind
    as an operation, `llm.*_messages.N.message.*` as `gen_ai.prompt/completion.N.*`, token counts,
    model, tool and agent. GenAI attributes the span also has win. Pure."""
    kind = str(attrs.get("openinference.span.kind", "")).upper()
    if not kind:
        return attrs
    mapped: dict[str, Any] = {"gen_ai.operation.name": OPENINFERENCE_OPERATIONS.get(kind, kind.lower())}
    for key, value in attrs.items():
        match = OPENINFERENCE_MESSAGE.match(key)
        if not match:
            continue
        direction, index, rest = match.groups()
        prefix = f"gen_ai.{'prompt' if direction == 'input' else 'completion'}.{index}."
        call = OPENINFERENCE_CALL.match(rest)
        if call:
            field = {"id": "id", "function.name": "name", "function.arguments": "arguments"}[call.group(2)]
            mapped[f"{prefix}tool_calls.{call.group(1)}.{field}"] = value
        elif rest in {"role", "content", "tool_call_id"}:
            mapped[prefix + rest] = value
    renames = {
        "llm.model_name": "gen_ai.request.model",
        "llm.token_count.prompt": "gen_ai.usage.input_tokens",
        "llm.token_count.completion": "gen_ai.usage.output_tokens",
        "agent.name": "gen_ai.agent.name",
        "tool.name": "gen_ai.tool.name",
        "tool_call.id": "gen_ai.tool.call.id",
    }
    for source, target in renames.items():
        if source in attrs:
            mapped[target] = attrs[source]
    if kind == "TOOL" and "output.value" in attrs:
        mapped["gen_ai.tool.call.result"] = attrs["output.value"]
    return {**mapped, **attrs}


def span_attributes(span: Span) -> dict[str, Any]:
    """A span's attributes as plain values, OpenInference's translated to GenAI names."""
    return _from_openinference(attributes_dict(span.attributes))


def _json(value: Any) -> Any:
    """A JSON-encoded attribute decoded (semconv puts structured values in strings), with its
    strings made storable (JSON may carry \u0000 or lone surrogates)."""
    if isinstance(value, str):
        try:
            return _clean_value(json.loads(value))
        except ValueError:
            return value
    return value


MAX_TOKENS = 2**31 - 1  # what a usage report's integer columns hold


def _int(value: Any) -> int | None:
    """A token count: a non-negative integer a usage report can store, else None (ignored)."""
    if isinstance(value, bool):
        return None
    number: int | None = None
    if isinstance(value, int):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (isinstance(value, str) and value.isdigit()):
        number = int(value)
    return number if number is not None and 0 <= number <= MAX_TOKENS else None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


# --- messages -----------------------------------------------------------------------------------


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


def _from_parts_message(entry: Any) -> sessions.MessageInput | None:
    """One message of `gen_ai.input.messages` / `gen_ai.output.messages` (parts), or an
    OpenAI-style {role, content, tool_calls, tool_call_id} object."""
    if not isinstance(entry, dict):
        return None
    role = _role(entry.get("role"))
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    tool_call_id = str(entry.get("tool_call_id") or entry.get("id") or "") if role == MessageRole.TOOL else ""
    for part in entry.get("parts") or []:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text" or kind == "reasoning":
            texts.append(_text(part.get("content")))
        elif kind == "tool_call":
            call = _tool_call(part.get("id"), part.get("name"), part.get("arguments"))
            if call:
                calls.append(call)
        elif kind == "tool_call_response":
            role = MessageRole.TOOL
            tool_call_id = str(part.get("id") or "")
            texts.append(_text(part.get("response") if "response" in part else part.get("result")))
        elif "content" in part:
            texts.append(_text(part.get("content")))
    if "content" in entry:
        content = entry["content"]
        if isinstance(content, list):  # OpenAI content parts
            texts.extend(_text(p.get("text") if isinstance(p, dict) else p) for p in content)
        else:
            texts.append(_text(content))
    for raw in _json(entry.get("tool_calls")) or []:
        if isinstance(raw, dict):
            function: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else raw
            call = _tool_call(raw.get("id"), function.get("name"), function.get("arguments"))
            if call:
                calls.append(call)
    choice = _json(entry.get("message"))
    if isinstance(choice, dict):  # a gen_ai.choice body
        return _from_parts_message({"role": "assistant", **choice})
    return _message(role, "\n".join(t for t in texts if t), tool_calls=calls, tool_call_id=tool_call_id)


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
                _text(row.get("content")),
                tool_calls=tool_calls,
                tool_call_id=_text(row.get("tool_call_id")),
            )
        )
    return result


def _event_messages(span: Span) -> list[sessions.MessageInput]:
    result = []
    for event in span.events:
        role = EVENT_ROLES.get(event.name)
        if role is None:
            continue
        attrs = attributes_dict(event.attributes)
        body = _json(attrs.get("gen_ai.event.content") or attrs.get("event.body") or attrs.get("body"))
        data = body if isinstance(body, dict) else attrs
        message = _from_parts_message({"role": role, **{k: v for k, v in data.items() if k != "role"}})
        if message is not None:
            result.append(message)
    return result


def span_messages(
    attrs: dict[str, Any], span: Span, operation: str, span_hex: str
) -> tuple[list[sessions.MessageInput], list[sessions.MessageInput]]:
    """(inputs, outputs) of a span, from whichever convention it uses. Pure."""
    inputs: list[sessions.MessageInput] = []
    outputs: list[sessions.MessageInput] = []
    system = _json(attrs.get("gen_ai.system_instructions"))
    if isinstance(system, list):
        text = "\n".join(_text(p.get("content")) if isinstance(p, dict) else _text(p) for p in system)
        inputs.append(_message(MessageRole.SYSTEM, text))
    elif isinstance(system, str) and system:
        inputs.append(_message(MessageRole.SYSTEM, system))
    for key, target in (("gen_ai.input.messages", inputs), ("gen_ai.output.messages", outputs)):
        value = _json(attrs.get(key))
        if isinstance(value, list):
            target.extend(m for m in map(_from_parts_message, value) if m is not None)
    if not inputs and not outputs:
        inputs = _indexed_messages(attrs, "prompt")
        outputs = _indexed_messages(attrs, "completion")
    if not inputs and not outputs:
        for message in _event_messages(span):
            (outputs if message.role == MessageRole.ASSISTANT else inputs).append(message)
    if operation == "execute_tool" and not outputs:
        call_id = _text(attrs.get("gen_ai.tool.call.id")) or f"otel-{span_hex}"
        result = attrs.get("gen_ai.tool.call.result", attrs.get("gen_ai.tool.output"))
        outputs.append(_message(MessageRole.TOOL, _text(result), tool_call_id=call_id))
        inputs = []  # the tool's arguments are the assistant's tool call, already recorded
    return inputs, outputs


def _fingerprint(role: str, content: str, tool_call_id: str, tool_calls: list[dict[str, Any]]) -> str:
    if role == MessageRole.TOOL:
        return f"tool\0{tool_call_id}"  # a tool answer is known by its call, whatever it returned
    ids = ",".join(str(c.get("id", "")) for c in tool_calls) if tool_calls else ""
    return f"{role}\0{content}\0{ids}"


# --- ingest -------------------------------------------------------------------------------------


@dataclass
class _Conversation:
    session: Session
    seen: Counter[str]


def _span_operation(attrs: dict[str, Any]) -> str:
    operation = attrs.get("gen_ai.operation.name") or attrs.get("llm.request.type")
    if operation:
        return OPERATION_NAME.sub("_", str(operation).lower()).strip("_")[:60] or "unknown"
    if attrs.get("gen_ai.tool.name"):
        return "execute_tool"
    if any(key.startswith(("gen_ai.prompt.", "gen_ai.completion.")) for key in attrs):
        return "chat"
    return ""


def _has_genai(attrs: dict[str, Any], span: Span) -> bool:
    return any(key.startswith("gen_ai.") for key in attrs) or any(
        event.name.startswith("gen_ai.") for event in span.events
    )


def _conversation(
    *, tenant: Tenant, agent: Agent, conversation_id: str, user_id: str, model: str,
    cache: dict[tuple[int, str], _Conversation],
) -> _Conversation:  # fmt: skip
    key = (agent.pk, conversation_id)
    found = cache.get(key)
    if found is not None and found.session.status == SessionStatus.OPEN:
        return found
    row = (
        OtelConversation.objects.select_for_update()
        .select_related("session", "session__agent")
        .filter(tenant=tenant, agent=agent, conversation_id=conversation_id)
        .first()
    )
    session = row.session if row is not None else None
    if session is None or session.status != SessionStatus.OPEN:
        try:
            with transaction.atomic():
                session = sessions.session_create(
                    tenant=tenant,
                    agent_external_id=agent.external_id,
                    user_id=user_id[:200],
                    model_name=model[:200],
                    metadata={"otel": {"conversation_id": conversation_id}},
                )
                if row is None:
                    OtelConversation.objects.create(
                        tenant=tenant, agent=agent, conversation_id=conversation_id, session=session
                    )
                else:
                    row.session = session
                    row.save(update_fields=["session"])
        except IntegrityError:
            # Another batch of the same new conversation won the race (the unique index made us
            # wait for its commit): use its session; ours was rolled back with the savepoint.
            row = (
                OtelConversation.objects.select_for_update()
                .select_related("session")
                .get(tenant=tenant, agent=agent, conversation_id=conversation_id)
            )
            session = row.session
    seen: Counter[str] = Counter(
        _fingerprint(role, content, tool_call_id, tool_calls)
        for role, content, tool_call_id, tool_calls in Message.objects.filter(session=session).values_list(
            "role", "content", "tool_call_id", "tool_calls"
        )
    )
    cache[key] = _Conversation(session=session, seen=seen)
    return cache[key]


def _claim_span(*, tenant: Tenant, trace_hex: str, span_hex: str, operation: str) -> int | None:
    """Insert the span's row; None if it was already recorded (waits for a concurrent sender)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {OtelSpan._meta.db_table} (tenant_id, trace_id, span_id, operation, created_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, trace_id, span_id) DO NOTHING RETURNING id",
            [tenant.pk, trace_hex, span_hex, operation, timezone.now()],
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None


def _valid_agent_id(text: str) -> bool:
    # The rule of sessions.agent_get_or_create: a bad name of one span must not spread to its trace.
    return (
        bool(text.strip())
        and len(text) <= sessions.AGENT_ID_MAX_LENGTH
        and "/" not in text
        and text.isprintable()
    )


def _trace_hints(request: ExportTraceServiceRequest) -> dict[str, dict[str, str]]:
    """Per trace id: the agent and conversation some span of it names (others inherit them)."""
    hints: dict[str, dict[str, str]] = {}
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attrs = span_attributes(span)
                hint = hints.setdefault(span.trace_id.hex(), {})
                agent = attrs.get("gen_ai.agent.name") or attrs.get("gen_ai.agent.id")
                conversation = attrs.get("gen_ai.conversation.id") or attrs.get("session.id")
                if agent and "agent" not in hint and _valid_agent_id(_text(agent)):
                    hint["agent"] = _text(agent)
                if conversation and "conversation" not in hint:
                    hint["conversation"] = _text(conversation)
    return hints


def _trace_hints_recorded(*, tenant: Tenant, hints: dict[str, dict[str, str]]) -> None:
    """Fill in the agent and conversation of traces that an earlier batch already recorded."""
    missing = [trace for trace, hint in hints.items() if "agent" not in hint or "conversation" not in hint]
    if not missing:
        return
    sessions_of = dict(
        OtelSpan.objects.filter(tenant=tenant, trace_id__in=missing, session__isnull=False).values_list(
            "trace_id", "session_id"
        )
    )
    rows = OtelConversation.objects.filter(
        tenant=tenant, session_id__in=set(sessions_of.values())
    ).values_list("session_id", "conversation_id", "agent__external_id")
    known = {session_id: (conversation, agent) for session_id, conversation, agent in rows}
    for trace, session_id in sessions_of.items():
        if session_id in known:
            conversation, agent = known[session_id]
            hints[trace].setdefault("agent", agent)
            hints[trace].setdefault("conversation", conversation)


def traces_ingest(
    *, tenant: Tenant, request: ExportTraceServiceRequest, bound_agent: str = ""
) -> IngestResult:
    """Record a decoded OTLP export. Idempotent per span (trace id + span id, per tenant).

    Spans are handled in the order they ended (an agent span ends after the model and tool
    spans inside it). Each span is recorded in its own savepoint: a span that cannot be recorded
    (no GenAI attributes, bad ids, an agent id ctxapp refuses) is counted in `rejected` with a
    reason and leaves nothing behind, and the others are still recorded. Records one
    `otel.<operation>` event per span, `usage.reported` per span with usage, and one
    `otel.rejected` event on the tenant stream when spans were rejected. Broadcasts after commit.
    With `bound_agent` (the API key is bound to that agent) every span is recorded as that agent,
    and a span naming another agent is rejected.
    """
    result = IngestResult()
    hints = _trace_hints(request)
    _trace_hints_recorded(tenant=tenant, hints=hints)
    spans: list[tuple[int, Span, dict[str, Any]]] = []
    for resource_spans in request.resource_spans:
        resource = attributes_dict(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append((span.end_time_unix_nano or span.start_time_unix_nano, span, resource))
    spans.sort(key=lambda entry: entry[0])
    cache: dict[tuple[int, str], _Conversation] = {}
    agents: dict[str, Agent] = {}
    with transaction.atomic():
        for _, span, resource in spans:
            try:
                with transaction.atomic():
                    _span_ingest(
                        tenant=tenant, span=span, resource=resource, hints=hints, cache=cache,
                        agents=agents, result=result, bound_agent=bound_agent,
                    )  # fmt: skip
            except (DomainError, DataError) as exc:
                # The savepoint rolled back: sessions and agents it created no longer exist. A
                # DataError (a value the database cannot store) is the span's fault, not ours.
                cache.clear()
                agents.clear()
                reason = exc.message if isinstance(exc, DomainError) else "a value cannot be stored"
                result.reject(f"span {span.span_id.hex() or '?'}: {reason}")
        if result.rejected:
            recorder.event_append(
                tenant=tenant,
                type="otel.rejected",
                payload={"rejected_spans": result.rejected, "errors": result.errors[:5]},
            )
    return result


def _span_ingest(
    *,
    tenant: Tenant,
    span: Span,
    resource: dict[str, Any],
    hints: dict[str, dict[str, str]],
    cache: dict[tuple[int, str], _Conversation],
    agents: dict[str, Agent],
    result: IngestResult,
    bound_agent: str,
) -> None:
    trace_hex, span_hex = span.trace_id.hex(), span.span_id.hex()
    if len(span.trace_id) != 16 or len(span.span_id) != 8 or not any(span.trace_id) or not any(span.span_id):
        raise InvalidInput("a span needs a 16-byte trace id and an 8-byte span id")
    attrs = span_attributes(span)
    if not _has_genai(attrs, span):
        raise InvalidInput(f"{span.name or 'span'!r} has no gen_ai.* attributes (not a GenAI span)")
    operation = _span_operation(attrs) or "unknown"
    if _claim_span(tenant=tenant, trace_hex=trace_hex, span_hex=span_hex, operation=operation) is None:
        result.duplicates += 1
        return
    hint = hints.get(trace_hex, {})
    agent = _span_agent(
        tenant=tenant, attrs=attrs, hint=hint, resource=resource, agents=agents, bound_agent=bound_agent
    )
    conversation_id = _text(
        attrs.get("gen_ai.conversation.id")
        or attrs.get("session.id")
        or hint.get("conversation")
        or trace_hex
    )[:CONVERSATION_ID_MAX_LENGTH]
    model = _text(attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model"))
    conversation = _conversation(
        tenant=tenant,
        agent=agent,
        conversation_id=conversation_id,
        user_id=_text(attrs.get("user.id") or attrs.get("enduser.id")),
        model=model,
        cache=cache,
    )
    session = conversation.session
    inputs, outputs = span_messages(attrs, span, operation, span_hex)
    new = _unseen_messages(
        conversation, inputs, outputs, operation=operation, trace_hex=trace_hex, span_hex=span_hex
    )
    recorded = sessions.messages_append(tenant=tenant, session=session, items=new) if new else []
    for message in new:
        conversation.seen[
            _fingerprint(message.role, message.content, message.tool_call_id, message.tool_calls)
        ] += 1
    OtelSpan.objects.filter(tenant=tenant, trace_id=trace_hex, span_id=span_hex).update(session=session)
    usage = _usage(attrs)
    payload = _span_payload(
        span, attrs, operation=operation, model=model, usage=usage, seqs=[m.seq for m in recorded]
    )
    recorder.event_append(
        tenant=tenant, type=f"otel.{operation}", agent=agent, session=session, payload=payload
    )
    if usage.get("gen_ai.usage.input_tokens") is not None:
        _usage_record(tenant=tenant, session=session, model=model, usage=usage, span_hex=span_hex)
    result.accepted += 1
    if session.public_id not in result.sessions:
        result.sessions.append(session.public_id)


def _span_agent(
    *,
    tenant: Tenant,
    attrs: dict[str, Any],
    hint: dict[str, str],
    resource: dict[str, Any],
    agents: dict[str, Agent],
    bound_agent: str,
) -> Agent:
    """The span's agent: a bound key's, else the one the span (or its trace) names, else the
    service. Raises AgentMismatch when a bound key's span names another agent."""
    named = _text(attrs.get("gen_ai.agent.name") or attrs.get("gen_ai.agent.id") or hint.get("agent"))
    if bound_agent and named and named != bound_agent:
        raise AgentMismatch(
            f"the API key is bound to agent {bound_agent!r}; this span names {named!r}",
            details={"bound_agent": bound_agent, "requested_agent": named},
        )
    agent_name = bound_agent or named or _text(resource.get("service.name")) or DEFAULT_AGENT
    if agent_name not in agents:
        agents[agent_name] = sessions.agent_get_or_create(tenant=tenant, external_id=agent_name)
    return agents[agent_name]


def _unseen_messages(
    conversation: _Conversation,
    inputs: list[sessions.MessageInput],
    outputs: list[sessions.MessageInput],
    *,
    operation: str,
    trace_hex: str,
    span_hex: str,
) -> list[sessions.MessageInput]:
    """The span's messages the session does not hold yet, tagged with the span."""
    # `seen` counts the session's messages by fingerprint; each span consumes from its own copy,
    # because every chat span repeats the whole history as its input.
    available = Counter(conversation.seen)
    new: list[sessions.MessageInput] = []
    for index, message in enumerate(inputs + outputs):
        mark = _fingerprint(message.role, message.content, message.tool_call_id, message.tool_calls)
        # A chat span's outputs are new by definition; an agent span's outputs repeat the last answer.
        fresh_output = index >= len(inputs) and operation != "invoke_agent"
        if available[mark] > 0 and not fresh_output:
            available[mark] -= 1
            continue
        message.metadata = {**message.metadata, "otel": {"trace_id": trace_hex, "span_id": span_hex}}
        new.append(message)
    return new


def _span_payload(
    span: Span,
    attrs: dict[str, Any],
    *,
    operation: str,
    model: str,
    usage: dict[str, int | None],
    seqs: list[int],
) -> dict[str, Any]:
    """The `otel.<operation>` event's payload (OpenTelemetry GenAI names where they exist)."""
    duration_ns = max(0, span.end_time_unix_nano - span.start_time_unix_nano)
    payload: dict[str, Any] = {
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "name": _clean_text(span.name)[:200],
        "gen_ai.operation.name": operation,
        "duration_ms": round(duration_ns / 1e6, 3),
        "status": {0: "unset", 1: "ok", 2: "error"}.get(span.status.code, "unset"),
        "messages": seqs,
    }
    if model:
        payload["gen_ai.request.model"] = model[:200]
    if attrs.get("gen_ai.tool.name"):
        payload["gen_ai.tool.name"] = _text(attrs["gen_ai.tool.name"])[:200]
    if span.status.message:
        payload["status_message"] = _clean_text(span.status.message)[:500]
    payload.update({key: value for key, value in usage.items() if value is not None})
    return payload


def _usage(attrs: dict[str, Any]) -> dict[str, int | None]:
    input_tokens = _int(attrs.get("gen_ai.usage.input_tokens", attrs.get("gen_ai.usage.prompt_tokens")))
    output_tokens = _int(attrs.get("gen_ai.usage.output_tokens", attrs.get("gen_ai.usage.completion_tokens")))
    if input_tokens is None and output_tokens is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": _int(attrs.get("gen_ai.usage.cache_read.input_tokens")),
        "gen_ai.usage.reasoning.output_tokens": _int(attrs.get("gen_ai.usage.reasoning.output_tokens")),
    }


def _usage_record(
    *, tenant: Tenant, session: Session, model: str, usage: dict[str, int | None], span_hex: str
) -> None:
    # No context build was estimated for this call, so estimated_input_tokens is 0 and the report
    # is left out of calibration (model_profiles.usage_correction); it still counts as usage.
    input_tokens = usage["gen_ai.usage.input_tokens"] or 0
    cached = usage.get("gen_ai.usage.cache_read.input_tokens")
    TokenUsageReport.objects.create(
        tenant=tenant,
        session=session,
        budget_sample=None,
        model_name=(model or session.model_name)[:200],
        tokenizer="",
        estimated_input_tokens=0,
        input_tokens=input_tokens,
        output_tokens=usage.get("gen_ai.usage.output_tokens"),
        cached_input_tokens=cached if cached is None or cached <= input_tokens else None,
        reasoning_tokens=usage.get("gen_ai.usage.reasoning.output_tokens"),
    )
    recorder.event_append(
        tenant=tenant,
        type="usage.reported",
        session=session,
        payload={"source": "otel", "span_id": span_hex, **usage},
    )


def traces_body_decompress(*, body: bytes, encoding: str) -> bytes:
    """The body without its Content-Encoding (gzip/deflate/identity), bounded by
    CTXAPP_MAX_BODY_BYTES after decompression. Raises PayloadTooLarge, OtlpMalformed,
    OtlpUnsupportedMediaType (an unknown encoding). Pure."""
    import zlib

    from memory.exceptions import PayloadTooLarge

    encoding = (encoding or "identity").strip().lower()
    if encoding in {"", "identity"}:
        return body
    if encoding not in {"gzip", "deflate"}:
        raise OtlpUnsupportedMediaType(
            f"Content-Encoding {encoding} is not supported: use gzip or none.", details={"encoding": encoding}
        )
    limit = settings.CTXAPP.max_body_bytes
    decompressor = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
    try:
        data = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpMalformed(f"The body is not valid {encoding} data: {exc}.") from None
    if len(data) > limit or decompressor.unconsumed_tail:
        raise PayloadTooLarge(
            f"The decompressed body is over the limit of {limit} bytes; send smaller batches.",
            details={"limit_bytes": limit},
        )
    return data


__all__ = [
    "IngestResult",
    "OtlpMalformed",
    "OtlpUnsupportedMediaType",
    "traces_body_decompress",
    "traces_ingest",
    "traces_request_decode",
    "traces_response_encode",
]
