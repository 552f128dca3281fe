"""POST /v1/traces: the real OpenTelemetry SDK exporter (OTLP/HTTP protobuf, gzip) against a live
server, and hand-made OTLP/JSON bodies, become sessions, messages, tool calls, usage and events."""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.utils import timezone
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from rest_framework.test import APIClient

from memory.models import Event, Message, OtelHeldSpan, OtelSpan, Session, Tenant, TokenUsageReport
from memory.services import otel_ingest, retention
from memory.services.model_profiles import usage_correction
from memory.services.otel_ingest import holding
from memory.services.tenancy import api_key_create
from memory.tasks.otel import otel_held_flush_task
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server


@pytest.fixture(scope="module")
def server(django_db_setup: None) -> Iterator[str]:
    with uvicorn_server(worker_env()) as base:
        yield base


def _messages(session: Session) -> list[Message]:
    return list(Message.objects.filter(session=session).order_by("seq"))


def _run_agent(tracer: Any, conversation: str, before_agent_ends: Any = None) -> None:
    """What an instrumented agent emits for one turn: agent span > chat, tool, chat. Only the
    agent span names the agent and the conversation."""
    system = [{"type": "text", "content": "You book trains."}]
    user = {"role": "user", "parts": [{"type": "text", "content": "A train to Lyon tomorrow?"}]}
    call = {
        "role": "assistant",
        "parts": [
            {"type": "tool_call", "id": "call_1", "name": "search_trains", "arguments": {"to": "Lyon"}}
        ],
    }
    tool = {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call_1", "response": "08:04, 10:04"}],
    }
    answer = {"role": "assistant", "parts": [{"type": "text", "content": "There is one at 08:04."}]}
    with tracer.start_as_current_span("invoke_agent travel-bot") as agent:
        agent.set_attribute("gen_ai.operation.name", "invoke_agent")
        agent.set_attribute("gen_ai.agent.name", "travel-bot")
        agent.set_attribute("gen_ai.conversation.id", conversation)
        agent.set_attribute("gen_ai.input.messages", json.dumps([user]))
        agent.set_attribute("gen_ai.output.messages", json.dumps([answer]))
        with tracer.start_as_current_span("chat gpt-4o") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o")
            chat.set_attribute("gen_ai.system_instructions", json.dumps(system))
            chat.set_attribute("gen_ai.input.messages", json.dumps([user]))
            chat.set_attribute("gen_ai.output.messages", json.dumps([call]))
            chat.set_attribute("gen_ai.usage.input_tokens", 120)
            chat.set_attribute("gen_ai.usage.output_tokens", 18)
        with tracer.start_as_current_span("execute_tool search_trains") as run:
            run.set_attribute("gen_ai.operation.name", "execute_tool")
            run.set_attribute("gen_ai.tool.name", "search_trains")
            run.set_attribute("gen_ai.tool.call.id", "call_1")
            run.set_attribute("gen_ai.tool.call.result", "08:04, 10:04")
        with tracer.start_as_current_span("chat gpt-4o") as chat:
            chat.set_attribute("gen_ai.operation.name", "chat")
            chat.set_attribute("gen_ai.request.model", "gpt-4o")
            chat.set_attribute("gen_ai.system_instructions", json.dumps(system))
            chat.set_attribute("gen_ai.input.messages", json.dumps([user, call, tool]))
            chat.set_attribute("gen_ai.output.messages", json.dumps([answer]))
            chat.set_attribute("gen_ai.usage.input_tokens", 160)
            chat.set_attribute("gen_ai.usage.output_tokens", 9)
        if before_agent_ends is not None:
            before_agent_ends()


def _exporter(server: str, key: str | None, **options: Any) -> OTLPSpanExporter:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return OTLPSpanExporter(endpoint=f"{server}/v1/traces", headers=headers, **options)


def _export_turn(exporter: OTLPSpanExporter, conversation: str) -> InMemorySpanExporter:
    """Run one agent turn under the SDK's BatchSpanProcessor (what production uses), flush it, and
    shut the provider (and the exporter) down. Returns the spans it exported."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "travel-service"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _run_agent(provider.get_tracer("test"), conversation)
    assert provider.force_flush(30_000)
    provider.shutdown()
    return memory


@pytest.mark.django_db(transaction=True)
def test_the_sdk_exporter_records_a_conversation_once(server: str) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, key = api_key_create(tenant=tenant, name="otel")
    exporter = OTLPSpanExporter(
        endpoint=f"{server}/v1/traces",
        headers={"Authorization": f"Bearer {key}"},
        compression=Compression.Gzip,
    )
    memory = _export_turn(exporter, "conv-42")

    session = Session.objects.get(tenant=tenant)
    assert session.agent.external_id == "travel-bot"
    assert session.metadata["otel"]["conversation_id"] == "conv-42"
    assert session.model_name == "gpt-4o"
    rows = [(m.role, m.content, m.tool_call_id) for m in _messages(session)]
    assert rows == [
        ("system", "You book trains.", ""),
        ("user", "A train to Lyon tomorrow?", ""),
        ("assistant", "", ""),
        ("tool", "08:04, 10:04", "call_1"),
        ("assistant", "There is one at 08:04.", ""),
    ]
    calls = _messages(session)[2].tool_calls
    assert calls == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "search_trains", "arguments": '{"to": "Lyon"}'},
        }
    ]
    usage = list(TokenUsageReport.objects.filter(session=session).order_by("input_tokens"))
    assert [(u.input_tokens, u.output_tokens, u.model_name) for u in usage] == [
        (120, 18, "gpt-4o"),
        (160, 9, "gpt-4o"),
    ]
    types = sorted(
        Event.objects.filter(tenant=tenant, type__startswith="otel.").values_list("type", flat=True)
    )
    assert types == ["otel.chat", "otel.chat", "otel.execute_tool", "otel.invoke_agent"]
    assert Event.objects.filter(tenant=tenant, type="usage.reported").count() == 2
    tool_event = Event.objects.get(tenant=tenant, type="otel.execute_tool")
    assert tool_event.payload["gen_ai.tool.name"] == "search_trains"
    assert tool_event.payload["gen_ai.agent.id"] == "travel-bot"

    # The exporter retries a batch it thinks failed: the same spans again record nothing new.
    counts = (Message.objects.count(), Event.objects.count(), TokenUsageReport.objects.count())
    assert _exporter(server, key).export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
    assert (Message.objects.count(), Event.objects.count(), TokenUsageReport.objects.count()) == counts
    assert OtelSpan.objects.filter(tenant=tenant).count() == 4

    # The next turn of the same conversation lands in the same session, without repeating history.
    _export_turn(_exporter(server, key), "conv-42")
    assert Session.objects.filter(tenant=tenant).count() == 1
    assert len(_messages(session)) == 8  # + the assistant's call, the tool answer, the answer


TURN_ROWS = [
    ("system", "You book trains.", ""),
    ("user", "A train to Lyon tomorrow?", ""),
    ("assistant", "", ""),
    ("tool", "08:04, 10:04", "call_1"),
    ("assistant", "There is one at 08:04.", ""),
]


@pytest.mark.parametrize("processor", ["simple", "batch"])
@pytest.mark.django_db(transaction=True)
def test_children_exported_before_their_agent_span_land_under_its_agent_and_conversation(
    server: str, processor: str
) -> None:
    """SimpleSpanProcessor sends each span as it ends, children first; a BatchSpanProcessor batch
    may be cut between the children and the agent span (here: flushed before the agent ends)."""
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, key = api_key_create(tenant=tenant, name="otel")
    provider = TracerProvider(resource=Resource.create({"service.name": "travel-service"}))
    exporter = _exporter(server, key)
    flush: Any = None
    if processor == "simple":
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(BatchSpanProcessor(exporter))
        flush = lambda: provider.force_flush(30_000)  # noqa: E731
    observed: dict[str, Any] = {}

    def children_sent() -> None:
        if flush is not None:
            assert flush()
        observed["messages"] = Message.objects.filter(tenant=tenant).count()
        observed["held"] = OtelHeldSpan.objects.filter(tenant=tenant).count()

    for turn in range(2):
        _run_agent(provider.get_tracer("test"), "conv-7", children_sent)
        assert provider.force_flush(30_000)
        if turn == 0:
            # The children arrived first and were held, not recorded under the service's name.
            assert observed == {"messages": 0, "held": 3}
    provider.shutdown()

    session = Session.objects.get(tenant=tenant)  # one session, under the agent the root names
    assert session.agent.external_id == "travel-bot"
    assert session.metadata["otel"]["conversation_id"] == "conv-7"
    rows = [(m.role, m.content, m.tool_call_id) for m in _messages(session)]
    assert rows == [*TURN_ROWS, *TURN_ROWS[2:]]  # the second turn repeats no history
    assert TokenUsageReport.objects.filter(session=session).count() == 4
    assert not OtelHeldSpan.objects.filter(tenant=tenant).exists()
    assert OtelSpan.objects.filter(tenant=tenant, session=session).count() == 8


@pytest.mark.django_db(transaction=True)
def test_a_wrong_key_is_refused_and_another_tenant_is_isolated(server: str) -> None:
    alice = Tenant.objects.create(name="Alice's team", slug="alice")
    bob = Tenant.objects.create(name="Bob's team", slug="bob")
    _, alice_key = api_key_create(tenant=alice, name="otel")
    _, bob_key = api_key_create(tenant=bob, name="otel")
    memory = _export_turn(_exporter(server, alice_key), "conv-1")
    spans = memory.get_finished_spans()

    assert _exporter(server, None).export(spans) == SpanExportResult.FAILURE
    assert _exporter(server, "ctx_nope_nope").export(spans) == SpanExportResult.FAILURE
    response = httpx.post(
        f"{server}/v1/traces", content=b"", headers={"Content-Type": "application/x-protobuf"}
    )
    assert response.status_code == 401

    # Bob sends the very same spans (same ids, same conversation id): they are his, not Alice's.
    assert _exporter(server, bob_key).export(spans) == SpanExportResult.SUCCESS
    alice_session = Session.objects.get(tenant=alice)
    bob_session = Session.objects.get(tenant=bob)
    assert alice_session.pk != bob_session.pk
    assert len(_messages(alice_session)) == 5
    assert len(_messages(bob_session)) == 5
    response = httpx.get(
        f"{server}/api/v1/sessions/{alice_session.public_id}", headers={"Authorization": f"Bearer {bob_key}"}
    )
    assert response.status_code == 404


# --- OTLP/JSON, in process ------------------------------------------------------------------------

TRACE = "5b8efff798038103d269b633813fc60c"


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _span(
    span_id: str, name: str, attrs: dict[str, Any], *, start: int, events: Any = None
) -> dict[str, Any]:
    return {
        "traceId": TRACE,
        "spanId": span_id,
        "name": name,
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 1000),
        "attributes": [_kv(k, v) for k, v in attrs.items()],
        "events": events or [],
    }


def _body(*spans: dict[str, Any]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_kv("service.name", "support-desk")]},
                "scopeSpans": [
                    {"scope": {"name": "opentelemetry.instrumentation.openai"}, "spans": list(spans)}
                ],
            }
        ]
    }


def _post_json(client: APIClient, body: Any, **headers: str) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.generic("POST", "/v1/traces", raw, content_type="application/json", **headers)


OPENLLMETRY_SPAN = {
    "gen_ai.system": "openai",
    "llm.request.type": "chat",
    "gen_ai.request.model": "gpt-4o-mini",
    "gen_ai.prompt.0.role": "user",
    "gen_ai.prompt.0.content": "Where is my parcel 991?",
    "gen_ai.completion.0.role": "assistant",
    "gen_ai.completion.0.content": "",
    "gen_ai.completion.0.tool_calls.0.id": "call_9",
    "gen_ai.completion.0.tool_calls.0.name": "track",
    "gen_ai.completion.0.tool_calls.0.arguments": '{"id": 991}',
    "gen_ai.usage.prompt_tokens": 31,
    "gen_ai.usage.completion_tokens": 12,
    "session.id": "ticket-7",
}


def test_openllmetry_attributes_and_span_events_become_messages(api_a: APIClient, tenant_a: Tenant) -> None:
    events = [
        {"timeUnixNano": "3", "name": "gen_ai.user.message", "attributes": [_kv("content", "Thanks!")]},
        {
            "timeUnixNano": "4",
            "name": "gen_ai.choice",
            "attributes": [_kv("message", json.dumps({"role": "assistant", "content": "You're welcome."}))],
        },
    ]
    body = _body(
        _span("0000000000000001", "openai.chat", OPENLLMETRY_SPAN, start=1000),
        _span("0000000000000002", "chat", {"gen_ai.operation.name": "chat", "session.id": "ticket-7"},
              start=5000, events=events),
    )  # fmt: skip
    response = _post_json(api_a, body)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/json"
    assert json.loads(response.content) == {}  # full success: no partialSuccess
    session = Session.objects.get(tenant=tenant_a)
    assert session.agent.external_id == "support-desk"  # no gen_ai.agent.*: the service name
    messages = _messages(session)
    assert [(m.role, m.content) for m in messages] == [
        ("user", "Where is my parcel 991?"),
        ("assistant", ""),
        ("user", "Thanks!"),
        ("assistant", "You're welcome."),
    ]
    assert messages[1].tool_calls[0]["function"] == {"name": "track", "arguments": '{"id": 991}'}
    assert messages[0].metadata["otel"] == {"trace_id": TRACE, "span_id": "0000000000000001"}
    report = TokenUsageReport.objects.get(session=session)
    assert (report.input_tokens, report.output_tokens) == (31, 12)


def test_unknown_and_malformed_spans_are_reported_not_fatal(api_a: APIClient, tenant_a: Tenant) -> None:
    body = _body(
        _span("0000000000000001", "openai.chat", OPENLLMETRY_SPAN, start=1000),
        _span("0000000000000002", "GET /health", {"http.method": "GET"}, start=2000),
        _span("00000003", "chat", {"gen_ai.operation.name": "chat"}, start=3000),  # 4-byte span id
        _span("0000000000000004", "chat", {**OPENLLMETRY_SPAN, "gen_ai.agent.name": "a/b"}, start=4000),
    )
    response = _post_json(api_a, body)
    assert response.status_code == 200
    partial = json.loads(response.content)["partialSuccess"]
    assert partial["rejectedSpans"] == "3"  # int64 → a JSON string in proto3's JSON mapping
    assert "no gen_ai.* attributes" in partial["errorMessage"]
    assert "span id" in partial["errorMessage"]
    assert "span 0000000000000004: An agent id is 1 to 200 printable characters" in partial["errorMessage"]
    assert Message.objects.filter(tenant=tenant_a).count() == 2  # the good span is recorded
    rejected = Event.objects.get(tenant=tenant_a, type="otel.rejected")
    assert rejected.payload["rejected_spans"] == 3
    assert not OtelSpan.objects.filter(span_id="0000000000000004").exists()  # a resend can retry it


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 400, "otlp_malformed"),
        (b'{"resourceSpans": 7}', "application/json", 400, "otlp_malformed"),
        (b"\xff\xff\xff\xff", "application/x-protobuf", 400, "otlp_malformed"),
        (b"<spans/>", "application/xml", 415, "unsupported_media_type"),
    ],
)
def test_a_malformed_body_is_a_4xx(
    api_a: APIClient, tenant_a: Tenant, body: bytes, content_type: str, status: int, code: str
) -> None:
    response = api_a.generic("POST", "/v1/traces", body, content_type=content_type)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert not Session.objects.filter(tenant=tenant_a).exists()


def test_gzip_json_is_accepted_and_a_gzip_bomb_is_refused(
    api_a: APIClient, tenant_a: Tenant, settings: Any
) -> None:
    body = gzip.compress(
        json.dumps(_body(_span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1))).encode()
    )
    response = api_a.generic(
        "POST", "/v1/traces", body, content_type="application/json", HTTP_CONTENT_ENCODING="gzip"
    )
    assert response.status_code == 200
    assert Message.objects.filter(tenant=tenant_a).count() == 2
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, max_body_bytes=4096)
    bomb = gzip.compress(b"{" + b" " * 100_000 + b"}")
    response = api_a.generic(
        "POST", "/v1/traces", bomb, content_type="application/json", HTTP_CONTENT_ENCODING="gzip"
    )
    assert response.status_code == 413


def test_a_read_only_key_cannot_write_traces(make_client: Any, tenant_a: Tenant) -> None:
    reader = make_client(tenant_a, ["read"])
    response = _post_json(reader, _body(_span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1)))
    assert response.status_code == 403
    assert not Message.objects.filter(tenant=tenant_a).exists()


def test_the_same_span_from_two_tenants_is_recorded_for_each(
    api_a: APIClient, api_b: APIClient, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    body = _body(_span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1))
    assert _post_json(api_a, body).status_code == 200
    assert _post_json(api_a, body).status_code == 200  # a resend: nothing new
    assert _post_json(api_b, body).status_code == 200
    assert Message.objects.filter(tenant=tenant_a).count() == 2
    assert Message.objects.filter(tenant=tenant_b).count() == 2
    session_a = Session.objects.get(tenant=tenant_a)
    assert api_b.get(f"/api/v1/sessions/{session_a.public_id}").status_code == 404


def test_span_ids_are_forgotten_with_the_events_they_produced(api_a: APIClient, tenant_a: Tenant) -> None:
    body = _body(_span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1))
    assert _post_json(api_a, body).status_code == 200
    retention.events_purge(tenant=tenant_a, now=timezone.now() + timedelta(days=89))
    assert OtelSpan.objects.filter(tenant=tenant_a).count() == 1
    retention.events_purge(tenant=tenant_a, now=timezone.now() + timedelta(days=91))
    assert not OtelSpan.objects.filter(tenant=tenant_a).exists()


def test_values_the_database_cannot_store_are_cleaned_or_ignored(api_a: APIClient, tenant_a: Tenant) -> None:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "a\u0000b"}]}]
        ),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "ok \ud800"}]),
        "gen_ai.usage.input_tokens": 2**40,  # more than a usage report holds: ignored, not a 500
    }
    response = _post_json(api_a, _body(_span("0000000000000001", "chat", attrs, start=1)))
    assert response.status_code == 200
    assert json.loads(response.content) == {}
    contents = list(Message.objects.filter(tenant=tenant_a).order_by("seq").values_list("content", flat=True))
    assert contents == ["a\ufffdb", "ok ?"]
    assert not TokenUsageReport.objects.filter(tenant=tenant_a).exists()


def test_a_key_bound_to_an_agent_records_only_as_that_agent(tenant_a: Tenant) -> None:
    _, secret = api_key_create(tenant=tenant_a, name="bound", agent_external_id="support-desk-1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    own = _span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1)  # names no agent
    other = {
        "traceId": "ab" * 16,
        **{k: v for k, v in own.items() if k != "traceId"},
        "spanId": "0000000000000002",
    }
    other["attributes"] = [*own["attributes"], _kv("gen_ai.agent.name", "billing-bot")]
    response = _post_json(client, _body(own, other))
    assert response.status_code == 200
    partial = json.loads(response.content)["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "bound to agent 'support-desk-1'" in partial["errorMessage"]
    assert list(Session.objects.filter(tenant=tenant_a).values_list("agent__external_id", flat=True)) == [
        "support-desk-1"
    ]


def test_a_conversation_whose_session_ended_continues_in_a_new_session(
    api_a: APIClient, tenant_a: Tenant
) -> None:
    assert (
        _post_json(api_a, _body(_span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1))).status_code
        == 200
    )
    first = Session.objects.get(tenant=tenant_a)
    assert api_a.post(f"/api/v1/sessions/{first.public_id}/end").status_code == 200
    later = {**OPENLLMETRY_SPAN, "gen_ai.prompt.0.content": "Any news on parcel 991?"}
    assert _post_json(api_a, _body(_span("0000000000000002", "chat", later, start=9))).status_code == 200
    second = Session.objects.filter(tenant=tenant_a).exclude(pk=first.pk).get()
    assert second.metadata["otel"]["conversation_id"] == "ticket-7"
    assert Message.objects.filter(session=second).first().content == "Any news on parcel 991?"
    assert Message.objects.filter(session=first).count() == 2


def test_otel_usage_does_not_calibrate_token_estimates(api_a: APIClient, tenant_a: Tenant) -> None:
    for index in range(1, 8):
        attrs = {**OPENLLMETRY_SPAN, "gen_ai.usage.prompt_tokens": 50_000}  # far from any estimate
        assert _post_json(api_a, _body(_span(f"{index:016x}", "chat", attrs, start=index))).status_code == 200
    assert TokenUsageReport.objects.filter(tenant=tenant_a, model_name="gpt-4o-mini").count() == 7
    assert usage_correction(tenant=tenant_a, model_name="gpt-4o-mini") == (1.0, 0)


def test_an_idempotency_key_is_accepted_and_span_ids_do_the_work(api_a: APIClient, tenant_a: Tenant) -> None:
    body = _body(_span("0000000000000001", "chat", OPENLLMETRY_SPAN, start=1))
    for _ in range(2):
        response = _post_json(api_a, body, HTTP_IDEMPOTENCY_KEY="export-1")
        assert response.status_code == 200
        assert json.loads(response.content) == {}
    assert Message.objects.filter(tenant=tenant_a).count() == 2


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b"null",
        b'"spans"',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "yy"}]}]}]}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "-1"}]}]}]}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": '
        b'[{"attributes": [{"key": "a", "value": {"intValue": "x"}}]}]}]}]}',
        b'{"resourceSpans": [{"resource": {"attributes": 5}}]}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": '
        b'[{"name": "\\u0000", "attributes": [{"key": "gen_ai.x"}]}]}]}]}',
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_hostile_json_is_a_4xx_or_a_partial_success_never_a_500(
    api_a: APIClient, tenant_a: Tenant, body: bytes
) -> None:
    response = _post_json(api_a, body)
    assert response.status_code in {200, 400}, response.content
    if response.status_code == 200:
        assert "partialSuccess" in json.loads(response.content) or json.loads(response.content) == {}


def test_openinference_spans_are_understood(api_a: APIClient, tenant_a: Tenant) -> None:
    llm = {
        "openinference.span.kind": "LLM",
        "session.id": "phoenix-1",
        "agent.name": "phoenix-bot",
        "llm.model_name": "claude-sonnet",
        "llm.input_messages.0.message.role": "system",
        "llm.input_messages.0.message.content": "Be brief.",
        "llm.input_messages.1.message.role": "user",
        "llm.input_messages.1.message.content": "Weather in Oslo?",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "toolu_1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "weather",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"city": "Oslo"}',
        "llm.token_count.prompt": 21,
        "llm.token_count.completion": 9,
    }
    tool = {
        "openinference.span.kind": "TOOL",
        "session.id": "phoenix-1",
        "tool.name": "weather",
        "tool_call.id": "toolu_1",
        "output.value": "-3 °C, snow",
    }
    response = _post_json(
        api_a,
        _body(
            _span("0000000000000001", "llm", llm, start=1),
            _span("0000000000000002", "tool", tool, start=5000),
        ),
    )
    assert json.loads(response.content) == {}
    session = Session.objects.get(tenant=tenant_a)
    assert (session.agent.external_id, session.model_name) == ("phoenix-bot", "claude-sonnet")
    rows = [(m.role, m.content, m.tool_call_id) for m in _messages(session)]
    assert rows == [
        ("system", "Be brief.", ""),
        ("user", "Weather in Oslo?", ""),
        ("assistant", "", ""),
        ("tool", "-3 °C, snow", "toolu_1"),
    ]
    assert _messages(session)[2].tool_calls[0]["function"] == {
        "name": "weather",
        "arguments": '{"city": "Oslo"}',
    }
    assert TokenUsageReport.objects.get(session=session).input_tokens == 21
    assert sorted(
        Event.objects.filter(tenant=tenant_a, type__startswith="otel.").values_list("type", flat=True)
    ) == [
        "otel.chat",
        "otel.execute_tool",
    ]


def _event(name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"timeUnixNano": "1", "name": name, "attributes": [_kv("gen_ai.event.content", json.dumps(body))]}


def test_history_resent_as_events_is_recorded_once_and_builds_pair_calls_with_replies(
    api_a: APIClient, tenant_a: Tenant
) -> None:
    """The event-based convention re-sends the history, the assistant's tool call included, as
    `gen_ai.assistant.message`: it is history, not a new output."""
    user = _event("gen_ai.user.message", {"content": "Is parcel 991 late?"})
    call = {"tool_calls": [{"id": "call_7", "type": "function",
                            "function": {"name": "track", "arguments": '{"id": 991}'}}]}  # fmt: skip
    choice = _event("gen_ai.choice", {"message": {"role": "assistant", **call}})
    first = _span("0000000000000001", "chat", {"gen_ai.operation.name": "chat", "session.id": "t-9"},
                  start=1000, events=[user, choice])  # fmt: skip
    resent = [
        user,
        _event("gen_ai.assistant.message", call),
        _event("gen_ai.tool.message", {"id": "call_7", "content": "delivered at 09:12"}),
        _event("gen_ai.choice", {"message": {"role": "assistant", "content": "It was delivered at 09:12."}}),
    ]
    second = _span("0000000000000002", "chat", {"gen_ai.operation.name": "chat", "session.id": "t-9"},
                   start=5000, events=resent)  # fmt: skip
    assert json.loads(_post_json(api_a, _body(first, second)).content) == {}
    session = Session.objects.get(tenant=tenant_a)
    rows = [(m.role, m.content, m.tool_call_id, len(m.tool_calls or [])) for m in _messages(session)]
    assert rows == [
        ("user", "Is parcel 991 late?", "", 0),
        ("assistant", "", "", 1),
        ("tool", "delivered at 09:12", "call_7", 0),
        ("assistant", "It was delivered at 09:12.", "", 0),
    ]
    build = api_a.post(f"/api/v1/sessions/{session.public_id}/context", {"input": "Thanks"}, format="json")
    assert build.status_code == 200, build.content
    messages = build.json()["messages"]
    called = [i for i, m in enumerate(messages) if m.get("tool_calls")]
    assert called, messages
    for index in called:
        ids = [c["id"] for c in messages[index]["tool_calls"]]
        replies = messages[index + 1 : index + 1 + len(ids)]
        assert [(m["role"], m.get("tool_call_id")) for m in replies] == [("tool", i) for i in ids]


def test_a_span_with_a_bad_id_is_rejected_alone_in_json_and_protobuf(
    api_a: APIClient, tenant_a: Tenant
) -> None:
    good = _span("0000000000000001", "openai.chat", OPENLLMETRY_SPAN, start=1000)
    bad = {**_span("0000000000000002", "chat", OPENLLMETRY_SPAN, start=2000), "spanId": "1"}
    response = _post_json(api_a, _body(good, bad))
    assert response.status_code == 200, response.content
    partial = json.loads(response.content)["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert partial["errorMessage"].startswith("span 1: not an OTLP span")
    late = {**good, "spanId": "0000000000000009", "endTimeUnixNano": "soon"}  # hex id, bad time
    partial = json.loads(_post_json(api_a, _body(late)).content)["partialSuccess"]
    assert partial["errorMessage"].startswith("span 0000000000000009: not an OTLP span")
    assert Message.objects.filter(tenant=tenant_a).count() == 2  # the good span is recorded

    other = {**good, "traceId": "ab" * 16}
    body = json.dumps(_body({**other, "spanId": "0000000000000003"}, other)).encode()
    request = otel_ingest.traces_request_decode(body=body, content_type="application/json").request
    request.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x01"  # one byte, not eight
    response = api_a.generic(
        "POST", "/v1/traces", request.SerializeToString(), content_type="application/x-protobuf"
    )
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert answer.partial_success.error_message == (
        "span 01: a span needs a 16-byte trace id and an 8-byte span id"
    )
    assert OtelSpan.objects.filter(tenant=tenant_a, trace_id="ab" * 16).count() == 1  # the good one


def test_a_held_span_whose_root_never_comes_is_recorded_after_the_hold(
    api_a: APIClient, tenant_a: Tenant
) -> None:
    child = _span("0000000000000002", "chat", OPENLLMETRY_SPAN, start=1000)
    child["parentSpanId"] = "00000000000000aa"  # a parent not sent yet
    assert json.loads(_post_json(api_a, _body(child)).content) == {}
    assert _post_json(api_a, _body(child)).status_code == 200  # a resend is held once
    assert OtelHeldSpan.objects.filter(tenant=tenant_a).count() == 1
    assert not Message.objects.filter(tenant=tenant_a).exists()

    # A child of a remote parent (another process's span) is a root here: recorded at once.
    remote = {**child, "traceId": "cd" * 16, "flags": 0x300}
    remote["attributes"] = [*child["attributes"], _kv("gen_ai.conversation.id", "ticket-8")]
    assert json.loads(_post_json(api_a, _body(remote)).content) == {}
    assert Session.objects.get(tenant=tenant_a).metadata["otel"]["conversation_id"] == "ticket-8"

    OtelHeldSpan.objects.update(received_at=timezone.now() - timedelta(seconds=holding.HOLD_SECONDS + 1))
    assert otel_held_flush_task.apply().get() == 1  # what Celery beat runs
    assert not OtelHeldSpan.objects.exists()
    session = Session.objects.get(tenant=tenant_a, metadata__otel__conversation_id="ticket-7")
    assert session.agent.external_id == "support-desk"  # nothing named an agent: the service
    assert [(m.content, m.metadata["otel"]["span_id"]) for m in _messages(session)] == [
        ("Where is my parcel 991?", "0000000000000002"),
        ("", "0000000000000002"),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_child_and_its_root_sent_at_the_same_time_land_together(server: str) -> None:
    """Two exports in flight at once, the child in one and its agent span in the other: whichever
    commits first, the child is recorded under the root's agent and conversation, none stays held."""
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, key = api_key_create(tenant=tenant, name="otel")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    bodies = []
    for index in range(6):
        trace = f"{index + 1:032x}"
        root = {**_span(f"{index + 1:016x}", "invoke_agent", {"gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "booking-bot", "gen_ai.conversation.id": f"c-{index}"}, start=9000),
                "traceId": trace}  # fmt: skip
        child = {**_span(f"{index + 101:016x}", "chat", OPENLLMETRY_SPAN, start=1000), "traceId": trace}
        child["attributes"] = [kv for kv in child["attributes"] if kv["key"] != "session.id"]
        child["parentSpanId"] = root["spanId"]
        bodies.append((json.dumps(_body(child)), json.dumps(_body(root))))
    with httpx.Client(base_url=server, headers=headers, timeout=30) as client, ThreadPoolExecutor(2) as pool:
        for child_body, root_body in bodies:
            answers = list(pool.map(lambda b: client.post("/v1/traces", content=b), [child_body, root_body]))
            assert [a.status_code for a in answers] == [200, 200]
    assert not OtelHeldSpan.objects.filter(tenant=tenant).exists()
    assert set(Session.objects.filter(tenant=tenant).values_list("agent__external_id", flat=True)) == {
        "booking-bot"
    }
    assert Session.objects.filter(tenant=tenant).count() == 6
    assert Message.objects.filter(tenant=tenant).count() == 12  # each child's question and tool call


# --- an app instrumented by OpenInference or OpenLLMetry alone: no agent span, no conversation id --

SYSTEM = {"role": "system", "content": "You track parcels."}
ASK = {"role": "user", "content": "Where is parcel 991?"}
TRACK = {"id": "call_1", "type": "function", "function": {"name": "track", "arguments": '{"id": 991}'}}
CALL = {"role": "assistant", "tool_calls": [TRACK]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "In Lyon, out for delivery."}
ANSWER = {"role": "assistant", "content": "It is in Lyon, out for delivery."}
FOLLOW_UP = {"role": "user", "content": "When will it arrive?"}
LAST = {"role": "assistant", "content": "Today before 6 pm."}
# Each model call is its own trace, re-sending the whole history: (input, output) of each.
CALLS = [([SYSTEM, ASK], CALL), ([SYSTEM, ASK, CALL, RESULT], ANSWER),
         ([SYSTEM, ASK, CALL, RESULT, ANSWER, FOLLOW_UP], LAST)]  # fmt: skip
CONVERSATION = [SYSTEM, ASK, CALL, RESULT, ANSWER, FOLLOW_UP, LAST]


def _flattened(prefix: str, message: dict[str, Any], call_keys: tuple[str, str, str]) -> dict[str, Any]:
    """An OpenAI-style message as an instrumentation's indexed attributes under `prefix`;
    `call_keys`: its names of a tool call's id, name and arguments."""
    attrs = {
        f"{prefix}.{key}": message[key] for key in ("role", "content", "tool_call_id") if message.get(key)
    }
    for n, call in enumerate(message.get("tool_calls", [])):
        values = (call["id"], call["function"]["name"], call["function"]["arguments"])
        attrs |= {
            f"{prefix}.tool_calls.{n}.{key}": value for key, value in zip(call_keys, values, strict=True)
        }
    return attrs


def _openllmetry_attributes(inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """What OpenLLMetry's OpenAI instrumentation sets on a chat span (its legacy attributes, the
    default): gen_ai.prompt.N.* per input, gen_ai.completion.0.* for the choice."""
    attrs: dict[str, Any] = {
        "gen_ai.system": "openai", "llm.request.type": "chat", "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini", "gen_ai.usage.prompt_tokens": 40,
        "gen_ai.usage.completion_tokens": 9,
        "gen_ai.completion.0.finish_reason": "tool_calls" if output.get("tool_calls") else "stop",
    }  # fmt: skip
    keys = ("id", "name", "arguments")
    for index, message in enumerate(inputs):
        attrs |= _flattened(f"gen_ai.prompt.{index}", message, keys)
    return attrs | _flattened("gen_ai.completion.0", output, keys)


def _openinference_attributes(inputs: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """What OpenInference's OpenAI instrumentation sets on an LLM span: llm.input_messages.N.message.*,
    llm.output_messages.0.message.*, the model and token counts, input.value and output.value."""
    attrs: dict[str, Any] = {
        "openinference.span.kind": "LLM", "llm.system": "openai", "llm.provider": "openai",
        "llm.model_name": "gpt-4o-mini", "llm.token_count.prompt": 40, "llm.token_count.completion": 9,
        "input.mime_type": "application/json",
        "input.value": json.dumps({"model": "gpt-4o-mini", "messages": inputs}),
        "output.value": json.dumps({"choices": [{"message": output}]}),
    }  # fmt: skip
    keys = ("tool_call.id", "tool_call.function.name", "tool_call.function.arguments")
    for index, message in enumerate(inputs):
        attrs |= _flattened(f"llm.input_messages.{index}.message", message, keys)
    return attrs | _flattened("llm.output_messages.0.message", output, keys)


def _model_call(tracer: Any, instrumentor: str, inputs: list[dict[str, Any]], output: dict[str, Any]) -> None:
    """One model call of an app with no span of its own around it: a root span, its own trace."""
    shaped = _openllmetry_attributes if instrumentor == "openllmetry" else _openinference_attributes
    name = "openai.chat" if instrumentor == "openllmetry" else "ChatCompletion"
    with tracer.start_as_current_span(name, kind=SpanKind.CLIENT) as span:
        for key, value in shaped(inputs, output).items():
            span.set_attribute(key, value)


def _rows_of(session: Session) -> list[tuple[str, str, str, list[str]]]:
    return [(m.role, m.content, m.tool_call_id, [c["id"] for c in m.tool_calls]) for m in _messages(session)]


def _expected(messages: list[dict[str, Any]]) -> list[tuple[str, str, str, list[str]]]:
    return [(m["role"], m.get("content") or "", m.get("tool_call_id", ""),
             [c["id"] for c in m.get("tool_calls", [])]) for m in messages]  # fmt: skip


@pytest.mark.parametrize("instrumentor", ["openllmetry", "openinference"])
@pytest.mark.django_db(transaction=True)
def test_traces_that_resend_a_conversation_continue_its_session(server: str, instrumentor: str) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, key = api_key_create(tenant=tenant, name="otel")
    provider = TracerProvider(resource=Resource.create({"service.name": "parcel-app"}))
    provider.add_span_processor(SimpleSpanProcessor(_exporter(server, key)))  # each span as it ends
    tracer = provider.get_tracer("test")
    other_ask = {"role": "user", "content": "Where is parcel 992?"}
    other_answer = {"role": "assistant", "content": "Parcel 992 was delivered."}

    _model_call(tracer, instrumentor, *CALLS[0])
    _model_call(tracer, instrumentor, [SYSTEM, other_ask], other_answer)  # another conversation meanwhile
    for inputs, output in CALLS[1:]:
        _model_call(tracer, instrumentor, inputs, output)
    # The other conversation goes on too, after the first one's history grew.
    _model_call(tracer, instrumentor, [SYSTEM, other_ask, other_answer, FOLLOW_UP], LAST)
    provider.shutdown()

    assert OtelSpan.objects.filter(tenant=tenant).values("trace_id").distinct().count() == 5
    sessions = list(Session.objects.filter(tenant=tenant).order_by("created_at"))
    assert len(sessions) == 2, [_rows_of(s) for s in sessions]  # one per conversation, not per trace
    first, other = sessions
    assert first.agent.external_id == other.agent.external_id == "parcel-app"
    assert _rows_of(first) == _expected(CONVERSATION)  # each message once, in order
    assert _rows_of(other) == _expected([SYSTEM, other_ask, other_answer, FOLLOW_UP, LAST])
    assert TokenUsageReport.objects.filter(session=first).count() == 3
    assert Message.objects.filter(tenant=tenant).count() == 12


@pytest.mark.django_db(transaction=True)
def test_a_trace_that_starts_a_conversation_anew_gets_its_own_session(server: str) -> None:
    """Only history that was answered counts: the same opening question twice is two conversations."""
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, key = api_key_create(tenant=tenant, name="otel")
    provider = TracerProvider(resource=Resource.create({"service.name": "parcel-app"}))
    provider.add_span_processor(SimpleSpanProcessor(_exporter(server, key)))
    tracer = provider.get_tracer("test")
    for _ in range(2):
        _model_call(tracer, "openllmetry", [SYSTEM, ASK], ANSWER)
    provider.shutdown()
    sessions = list(Session.objects.filter(tenant=tenant))
    assert len(sessions) == 2
    assert all(_rows_of(s) == _expected([SYSTEM, ASK, ANSWER]) for s in sessions)
