"""OTLP ingest: spans per second through memory.services.otel_ingest (decode + record), a resend.

    python bench/bench_otel_ingest.py [--conversations 20] [--turns 10]

Each conversation is one agent turn per "turn": an invoke_agent span around a chat span (with the
whole history as its input, as instrumentations send it), an execute_tool span and a second chat
span, so history dedupe is exercised. All spans are encoded as one protobuf batch per turn (what
the SDK's BatchSpanProcessor sends). Prints spans/s for the first send and for a resend of every
batch (which must record nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")

import django

django.setup()

from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402

from memory.models import Message, Tenant  # noqa: E402
from memory.services import otel_ingest  # noqa: E402


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _text(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def turn_batch(conversation: int, turn: int, history: list[dict[str, Any]]) -> bytes:
    trace = (conversation * 1000 + turn + 1).to_bytes(16, "big")
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    user = _text("user", f"Question {turn} of conversation {conversation}: what about item {turn * 7}?")
    call = {
        "role": "assistant",
        "parts": [
            {
                "type": "tool_call",
                "id": f"c{conversation}-{turn}",
                "name": "lookup",
                "arguments": {"item": turn * 7},
            }
        ],
    }
    tool = {
        "role": "tool",
        "parts": [
            {
                "type": "tool_call_response",
                "id": f"c{conversation}-{turn}",
                "response": f"item {turn * 7} is in stock",
            }
        ],
    }
    answer = _text("assistant", f"Item {turn * 7} is in stock; it ships tomorrow.")

    def span(index: int, attrs: dict[str, Any], start: int) -> None:
        item = scope.spans.add(trace_id=trace, span_id=(index + 1).to_bytes(8, "big"), name="span")
        item.start_time_unix_nano, item.end_time_unix_nano = start, start + 10
        item.attributes.extend(_kv(k, v) for k, v in attrs.items())

    conv = {"gen_ai.conversation.id": f"conv-{conversation}"}
    span(
        0,
        {
            **conv,
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "bench-bot",
            "gen_ai.input.messages": json.dumps([user]),
            "gen_ai.output.messages": json.dumps([answer]),
        },
        100,
    )
    span(
        1,
        {
            **conv,
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.input.messages": json.dumps([*history, user]),
            "gen_ai.output.messages": json.dumps([call]),
            "gen_ai.usage.input_tokens": 100 + turn * 50,
            "gen_ai.usage.output_tokens": 12,
        },
        10,
    )
    span(
        2,
        {
            **conv,
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.id": f"c{conversation}-{turn}",
            "gen_ai.tool.call.result": f"item {turn * 7} is in stock",
        },
        30,
    )
    span(
        3,
        {
            **conv,
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.input.messages": json.dumps([*history, user, call, tool]),
            "gen_ai.output.messages": json.dumps([answer]),
            "gen_ai.usage.input_tokens": 140 + turn * 50,
            "gen_ai.usage.output_tokens": 15,
        },
        50,
    )
    history.extend([user, call, tool, answer])
    return request.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=20)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    old = setup_databases(verbosity=0, interactive=False)
    try:
        tenant = Tenant.objects.create(name="bench", slug="bench")
        batches = []
        for conversation in range(args.conversations):
            history: list[dict[str, Any]] = []
            batches += [turn_batch(conversation, turn, history) for turn in range(args.turns)]
        spans = 4 * len(batches)
        for label in ("first send", "resend"):
            started = time.perf_counter()
            accepted = duplicates = 0
            for body in batches:
                request = otel_ingest.traces_request_decode(body=body, content_type="application/x-protobuf")
                result = otel_ingest.traces_ingest(tenant=tenant, request=request.request)
                accepted += result.accepted
                duplicates += result.duplicates
            elapsed = time.perf_counter() - started
            print(
                f"{label}: {spans} spans in {len(batches)} batches, {elapsed:.2f} s, "
                f"{spans / elapsed:.0f} spans/s (recorded {accepted}, already recorded {duplicates})"
            )
        expected = args.conversations * args.turns * 4
        print(
            f"messages stored: {Message.objects.filter(tenant=tenant).count()} (expected {expected}: "
            "user, assistant call, tool, answer per turn; no history repeated)"
        )
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
