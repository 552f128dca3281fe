"""The trace view: the span tree of an OpenTelemetry run (agent → chat → tool) with durations,
tokens, model, status and cost, and the traces of a session or an agent. Read-only.

It reads the `otel.<operation>` events OpenTelemetry ingest records, one per span (payload:
trace and span ids, parent, name, duration, start, status, model, tool, usage), so it shows what
was recorded and goes when retention purges those events. A call's cost is shown only when the
tenant set the price of its model (Model profiles in the admin: USD per million input and
output tokens); otherwise the cost is unknown, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import Count, Sum
from django.http import Http404, HttpResponse
from django.shortcuts import render

from dashboard import access
from dashboard.access import TenantRequest
from memory.models import Agent, Event, ModelProfile, OtelSpan, Session, Tenant, TokenUsageReport

TRACES_LISTED = 20
EVENTS_READ = 2000  # the latest span events a list reads (a list is a recent view, not a report)
MILLION = Decimal(1_000_000)

Prices = dict[str, tuple[Decimal | None, Decimal | None]]


@dataclass
class SpanNode:
    span_id: str
    parent_id: str
    name: str
    operation: str
    duration_ms: float
    start_ms: float | None
    status: str
    status_message: str
    model: str
    tool: str
    input_tokens: int | None
    output_tokens: int | None
    cost: Decimal | None
    session_id: str
    order: int
    depth: int = 0
    offset_pct: float = 0.0
    width_pct: float = 100.0
    children: list[SpanNode] = field(default_factory=list)

    @property
    def indent(self) -> str:
        return "\u2003" * self.depth  # em spaces: the page's CSP allows no inline style


@dataclass
class Trace:
    trace_id: str
    spans: list[SpanNode]  # depth-first, parents before children
    sessions: list[str]

    @property
    def root(self) -> SpanNode:
        return self.spans[0]

    @property
    def duration_ms(self) -> float:
        return max(span.duration_ms for span in self.spans if span.depth == 0)

    @property
    def input_tokens(self) -> int:
        return sum(span.input_tokens or 0 for span in self.spans)

    @property
    def output_tokens(self) -> int:
        return sum(span.output_tokens or 0 for span in self.spans)

    @property
    def cost(self) -> Decimal | None:
        """The sum of the calls' costs; None when a call with usage has no known price."""
        priced = [span for span in self.spans if span.input_tokens is not None or span.output_tokens]
        if not priced or any(span.cost is None for span in priced):
            return None
        return sum((span.cost or Decimal(0) for span in priced), Decimal(0))

    @property
    def errors(self) -> int:
        return sum(span.status == "error" for span in self.spans)

    @property
    def status(self) -> str:
        """`error` when a span failed, `ok` when one said so and none failed, else `unset`: a trace
        none of whose spans set a status is not known to be ok."""
        statuses = {span.status for span in self.spans}
        return "error" if "error" in statuses else "ok" if "ok" in statuses else "unset"


def _prices(tenant: Tenant) -> Prices:
    rows = ModelProfile.objects.filter(tenant=tenant).values_list(
        "name", "input_usd_per_mtok", "output_usd_per_mtok"
    )
    return {name.lower(): (inp, out) for name, inp, out in rows if inp is not None or out is not None}


def call_cost(
    prices: Prices, model: str, input_tokens: int | None, output_tokens: int | None
) -> Decimal | None:
    """What a call cost at the tenant's price of its model; None when a price it needs is unknown."""
    if input_tokens is None and output_tokens is None:
        return None
    input_price, output_price = prices.get(model.lower(), (None, None))
    total = Decimal(0)
    for tokens, price in ((input_tokens, input_price), (output_tokens, output_price)):
        if tokens:
            if price is None:
                return None
            total += Decimal(tokens) * price / MILLION
    return total


def _node(event: Event, prices: Prices) -> SpanNode:
    payload: dict[str, Any] = event.payload
    model = str(payload.get("gen_ai.request.model", ""))
    input_tokens = payload.get("gen_ai.usage.input_tokens")
    output_tokens = payload.get("gen_ai.usage.output_tokens")
    return SpanNode(
        span_id=str(payload.get("span_id", "")),
        parent_id=str(payload.get("parent_span_id", "")),
        name=str(payload.get("name", "")),
        operation=str(payload.get("gen_ai.operation.name", event.type.removeprefix("otel."))),
        duration_ms=float(payload.get("duration_ms", 0.0)),
        start_ms=payload.get("start_ms"),
        status=str(payload.get("status", "unset")),
        status_message=str(payload.get("status_message", "")),
        model=model,
        tool=str(payload.get("gen_ai.tool.name", "")),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=call_cost(prices, model, input_tokens, output_tokens),
        session_id=event.session.public_id if event.session is not None else "",
        order=event.pk,
    )


def _tree(trace_id: str, nodes: list[SpanNode]) -> Trace:
    """The spans in tree order (a span whose parent was not recorded is a root), each with its
    depth and its place on the trace's time line."""
    by_id = {node.span_id: node for node in nodes}
    roots: list[SpanNode] = []
    for node in nodes:
        parent = by_id.get(node.parent_id) if node.parent_id else None
        (parent.children if parent is not None and parent is not node else roots).append(node)
    ordered: list[SpanNode] = []

    def walk(node: SpanNode, depth: int) -> None:
        node.depth = depth
        ordered.append(node)
        for child in sorted(node.children, key=lambda c: (c.start_ms or 0.0, c.order)):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda r: (r.start_ms or 0.0, r.order)):
        walk(root, 0)
    starts = [n.start_ms for n in ordered if n.start_ms is not None]
    if starts:
        begin = min(starts)
        span = max(max((n.start_ms or begin) + n.duration_ms for n in ordered) - begin, 1e-9)
        for node in ordered:
            if node.start_ms is not None:
                node.offset_pct = round((node.start_ms - begin) / span * 100, 2)
                node.width_pct = max(round(node.duration_ms / span * 100, 2), 0.5)
    sessions = sorted({n.session_id for n in ordered if n.session_id})
    return Trace(trace_id=trace_id, spans=ordered, sessions=sessions)


def _span_events(**filters: Any) -> Any:
    return (
        Event.objects.filter(type__startswith="otel.", **filters)
        .exclude(type="otel.rejected")
        .select_related("session")
    )


def trace_get(*, tenant: Tenant, trace_id: str) -> Trace | None:
    """The recorded spans of one trace of the tenant, as a tree; None if it has none."""
    session_ids = set(
        OtelSpan.objects.filter(tenant=tenant, trace_id=trace_id, session__isnull=False).values_list(
            "session_id", flat=True
        )
    )
    events = list(_span_events(tenant=tenant, session_id__in=session_ids, payload__trace_id=trace_id))
    if not events:
        return None
    prices = _prices(tenant)
    return _tree(trace_id, [_node(event, prices) for event in events])


def _traces_of(tenant: Tenant, events: list[Event]) -> list[Trace]:
    prices = _prices(tenant)
    grouped: dict[str, list[SpanNode]] = defaultdict(list)
    for event in events:
        grouped[str(event.payload.get("trace_id", ""))].append(_node(event, prices))
    traces = [_tree(trace_id, nodes) for trace_id, nodes in grouped.items() if trace_id]
    traces.sort(key=lambda trace: max(span.order for span in trace.spans), reverse=True)
    return traces[:TRACES_LISTED]


def _reported_usage(tenant: Tenant, session: Session) -> dict[str, Any]:
    """Every usage report of the session (OpenTelemetry spans, POST /usage), priced per model."""
    prices = _prices(tenant)
    rows = (
        TokenUsageReport.objects.filter(tenant=tenant, session=session)
        .values("model_name")
        .annotate(calls=Count("id"), input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"))
    )
    costs = [call_cost(prices, r["model_name"], r["input_tokens"], r["output_tokens"] or 0) for r in rows]
    return {
        "calls": sum(r["calls"] for r in rows),
        "input_tokens": sum(r["input_tokens"] or 0 for r in rows),
        "output_tokens": sum(r["output_tokens"] or 0 for r in rows),
        "cost": sum((c for c in costs if c is not None), Decimal(0)) if costs and None not in costs else None,
    }


def session_traces(*, tenant: Tenant, session: Session, **_: Any) -> dict[str, Any]:
    """The session's traces (newest first) and the usage reported for it: calls, tokens, cost."""
    events = list(_span_events(tenant=tenant, session=session).order_by("-id")[:EVENTS_READ])
    return {
        "session": session,
        "traces": _traces_of(tenant, events),
        "usage": _reported_usage(tenant, session),
    }


def agent_traces(*, tenant: Tenant, agent: Agent, **_: Any) -> dict[str, Any]:
    events = list(_span_events(tenant=tenant, agent=agent).order_by("-id")[:EVENTS_READ])
    return {"agent": agent, "traces": _traces_of(tenant, events)}


@access.tenant_view
def trace_detail(request: TenantRequest, trace_id: str) -> HttpResponse:
    trace = trace_get(tenant=request.tenant, trace_id=trace_id.lower())
    if trace is None:
        raise Http404("No such trace.")
    context = {
        "page": "trace",
        "tenant": request.tenant,
        "tenants": access.tenants_for_user(user=request.user),
        "trace": trace,
    }
    return render(request, "dashboard/trace.html", context)
