"""OpenTelemetry ingest: OTLP trace batches that follow the GenAI semantic conventions become
sessions, messages (with tool calls), token-usage reports and events.

The wire format is decoded by the `opentelemetry-proto` package (protobuf classes, and
`google.protobuf.json_format` for OTLP/JSON); this module only maps decoded spans.

Mapping (docs/integrations.md, "OpenTelemetry traces"):
- agent: `gen_ai.agent.name` or `gen_ai.agent.id` of the span, else of any span of its trace in
  the same batch, held or recorded before, else the resource's `service.name`, else `otel`; a
  child span that arrives before its trace names agent and conversation is held (holding.py);
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
The package is layered, every import at module top: `attributes` (OTLP values as Python ones,
OpenInference translated) → `messages` (a span's messages); `wire` (decompress, decode, encode,
the errors, IngestResult); `holding` (held spans, the per-trace lock); `ingest` (record the
spans) imports them all, none imports it.
"""

from memory.services.otel_ingest.attributes import any_value, attributes_dict, span_attributes
from memory.services.otel_ingest.ingest import held_spans_flush, traces_ingest
from memory.services.otel_ingest.messages import span_messages
from memory.services.otel_ingest.wire import (
    DecodedTraces,
    IngestResult,
    OtlpMalformed,
    OtlpUnsupportedMediaType,
    traces_body_decompress,
    traces_request_decode,
    traces_response_encode,
)

__all__ = [
    "DecodedTraces",
    "IngestResult",
    "OtlpMalformed",
    "OtlpUnsupportedMediaType",
    "any_value",
    "attributes_dict",
    "held_spans_flush",
    "span_attributes",
    "span_messages",
    "traces_body_decompress",
    "traces_ingest",
    "traces_request_decode",
    "traces_response_encode",
]
