"""The trace view: the real SDK's spans of one agent run, sent to POST /v1/traces, shown as a span
tree with durations, tokens, model, status and cost; linked from the session and agent pages."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import Client
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rest_framework.test import APIClient

from memory.models import Event, ModelProfile, Session, Tenant
from tests.memory.api.test_otel import _run_agent

pytestmark = pytest.mark.django_db


def _send_run(api: APIClient) -> str:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "travel-service"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _run_agent(provider.get_tracer("test"), "conv-3")
    spans = memory.get_finished_spans()  # children first, as an exporter sends them
    body = encode_spans(spans).SerializeToString()
    response = api.generic("POST", "/v1/traces", body, content_type="application/x-protobuf")
    assert response.status_code == 200
    return format(spans[0].context.trace_id, "032x")


def _rows(html: str) -> list[str]:
    body = html.split('data-testid="trace-spans"', 1)[1].split("</table>", 1)[0]
    return body.split("<tr data-span=")[1:]


def test_the_trace_view_shows_the_span_tree_with_tokens_and_cost(
    api_a: APIClient, web_alice: Client, web_bob: Client, tenant_a: Tenant
) -> None:
    ModelProfile.objects.create(
        tenant=tenant_a, name="gpt-4o", input_limit=128000, output_limit=16384, tokenizer="o200k_base",
        input_usd_per_mtok=Decimal("2.50"), output_usd_per_mtok=Decimal("10.00"),
    )  # fmt: skip
    trace_id = _send_run(api_a)
    page = web_alice.get(f"/traces/{trace_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    rows = _rows(html)
    depths = [row.split('data-depth="', 1)[1].split('"', 1)[0] for row in rows]
    assert depths == ["0", "1", "1", "1"]  # the agent span, then its chat, tool, chat in start order
    assert "invoke_agent travel-bot" in rows[0]
    assert ["<code>chat</code>" in rows[1], "<code>execute_tool</code>" in rows[2]] == [True, True]
    assert "gpt-4o" in rows[1] and "search_trains" in rows[2]
    # 120 in at $2.50/M + 18 out at $10/M; then 160 at 2.50 + 9 at 10 per million
    assert "<td>120</td>" in rows[1] and "<td>18</td>" in rows[1] and "$0.000480" in rows[1]
    assert "$0.000490" in rows[3]
    events = {e.payload["span_id"]: e.payload for e in Event.objects.filter(type__startswith="otel.")}
    for row in rows:
        span_id = row.split('"', 2)[1]
        assert f"{events[span_id]['duration_ms']:.1f} ms" in row
        assert ">unset</span>" in row
    assert "280 input + 27 output tokens" in html and "cost $0.000970" in html

    session = Session.objects.get(tenant=tenant_a)
    session_page = web_alice.get(f"/sessions/{session.public_id}/").content.decode()
    assert f'href="/traces/{trace_id}/"' in session_page
    assert "2 model calls reported: 280 input + 27 output tokens · cost $0.000970" in session_page
    agent_page = web_alice.get("/agents/travel-bot/").content.decode()
    assert f'href="/traces/{trace_id}/"' in agent_page

    assert web_bob.get(f"/traces/{trace_id}/").status_code == 404  # another tenant's trace


def test_without_a_price_the_cost_is_unknown(api_a: APIClient, web_alice: Client, tenant_a: Tenant) -> None:
    trace_id = _send_run(api_a)
    html = web_alice.get(f"/traces/{trace_id}/").content.decode()
    assert "cost unknown" in html and "$" not in html.split('data-testid="trace-spans"', 1)[1]
    session = Session.objects.get(tenant=tenant_a)
    page = web_alice.get(f"/sessions/{session.public_id}/")
    assert "cost unknown (set the model's price in Model profiles)" in page.content.decode()


def test_a_failed_span_shows_its_status_and_message(api_a: APIClient, web_alice: Client) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    attrs = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "book_flight"}},
    ]
    span = {"traceId": trace, "spanId": "00f067aa0ba902b7", "name": "execute_tool book_flight",
            "startTimeUnixNano": "1000000", "endTimeUnixNano": "251000000", "attributes": attrs,
            "status": {"code": 2, "message": "airline API timed out"}}  # fmt: skip
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    assert api_a.post("/v1/traces", body, format="json").json() == {}
    html = web_alice.get(f"/traces/{trace}/").content.decode()
    (row,) = _rows(html)
    assert "book_flight" in row and "250.0 ms" in row
    assert '>error</span> <span class="hint">airline API timed out</span>' in row
    assert "1 failed" in html


def _trace_list_status(html: str) -> str:
    (row,) = html.split('data-testid="trace-list"', 1)[1].split("</table>", 1)[0].split("<tr><td>")[1:]
    return row.rsplit("<td>", 1)[1].split("</td>", 1)[0]


def test_a_tool_span_shows_its_tools_name_even_when_it_carries_a_model(
    api_a: APIClient, web_alice: Client
) -> None:
    trace = "4bf92f3577b34da6a3ce929d0e0e4737"
    chat = [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.request.model", "value": {"stringValue": "gpt-4o"}}]  # fmt: skip
    # Some instrumentations put the run's model on every span of it, the tool's too.
    tool = [*chat[1:], {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "search_trains"}}]  # fmt: skip
    spans = [
        {"traceId": trace, "spanId": "00f067aa0ba902b1", "name": "chat gpt-4o", "attributes": chat,
         "startTimeUnixNano": "1000000", "endTimeUnixNano": "9000000"},
        {"traceId": trace, "spanId": "00f067aa0ba902b2", "parentSpanId": "00f067aa0ba902b1",
         "name": "execute_tool search_trains", "attributes": tool,
         "startTimeUnixNano": "2000000", "endTimeUnixNano": "3000000"},
    ]  # fmt: skip
    assert (
        api_a.post(
            "/v1/traces", {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}, format="json"
        ).json()
        == {}
    )
    chat_row, tool_row = _rows(web_alice.get(f"/traces/{trace}/").content.decode())
    assert "<td>gpt-4o</td>" in chat_row
    assert "<td>search_trains</td>" in tool_row and "gpt-4o" not in tool_row


def test_a_trace_whose_spans_set_no_status_is_not_called_ok(
    api_a: APIClient, web_alice: Client, tenant_a: Tenant
) -> None:
    _send_run(api_a)  # the SDK leaves every span's status unset
    session = Session.objects.get(tenant=tenant_a)
    html = web_alice.get(f"/sessions/{session.public_id}/").content.decode()
    assert _trace_list_status(html) == '<span class="badge">unset</span>'

    trace = "4bf92f3577b34da6a3ce929d0e0e4738"
    attrs = [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
             {"key": "gen_ai.conversation.id", "value": {"stringValue": "conv-ok"}}]  # fmt: skip
    span = {"traceId": trace, "spanId": "00f067aa0ba902b9", "name": "chat", "attributes": attrs,
            "startTimeUnixNano": "1000000", "endTimeUnixNano": "2000000", "status": {"code": 1}}  # fmt: skip
    assert (
        api_a.post(
            "/v1/traces", {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}, format="json"
        ).json()
        == {}
    )
    ok_session = Session.objects.get(tenant=tenant_a, metadata__otel__conversation_id="conv-ok")
    html = web_alice.get(f"/sessions/{ok_session.public_id}/").content.decode()
    assert _trace_list_status(html) == '<span class="badge ok">ok</span>'
