"""OTLP attribute values as plain Python values, OpenInference's names read as GenAI ones. Pure.

The lowest layer of OpenTelemetry ingest: the other modules of the package import it.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def clean_text(text: str) -> str:
    # PostgreSQL text holds no NUL and JSON may carry lone surrogates: neither is storable.
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def any_value(value: AnyValue) -> Any:
    """An OTLP AnyValue as a plain Python value (bytes as base64 text). Pure."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return clean_text(value.string_value)
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
        result[clean_text(item.key)] = any_value(item.value)
    return result


def _clean_value(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean_value(item) for item in value]
    if isinstance(value, dict):
        return {clean_text(str(key)): _clean_value(item) for key, item in value.items()}
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


def json_value(value: Any) -> Any:
    """A JSON-encoded attribute decoded (semconv puts structured values in strings), with its
    strings made storable (JSON may carry \u0000 or lone surrogates)."""
    if isinstance(value, str):
        try:
            return _clean_value(json.loads(value))
        except ValueError:
            return value
    return value


MAX_TOKENS = 2**31 - 1  # what a usage report's integer columns hold


def token_count(value: Any) -> int | None:
    """A token count: a non-negative integer a usage report can store, else None (ignored)."""
    if isinstance(value, bool):
        return None
    number: int | None = None
    if isinstance(value, int):
        number = value
    elif (isinstance(value, float) and value.is_integer()) or (isinstance(value, str) and value.isdigit()):
        number = int(value)
    return number if number is not None and 0 <= number <= MAX_TOKENS else None


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
