"""Spans held until their trace says which agent and conversation it belongs to. Writes.

Exporters send a span when it ends, and a parent ends after its children: under
SimpleSpanProcessor, or a BatchSpanProcessor batch cut between them, the model and tool spans of
an agent arrive before the agent span that names the agent (`gen_ai.agent.name`) and often the
conversation (`gen_ai.conversation.id`). Such a child is held (OtelHeldSpan) instead of recorded
under the service's name and the trace id, and recorded with its trace once the trace is ready:

- a root of the trace arrived (a span with no parent, or whose parent is remote: another
  process, OTLP's span flags), or
- some span of the trace named both the agent and the conversation (in this export, held, or
  recorded before), or
- the oldest held span of the trace is older than HOLD_SECONDS (its root may never come to us:
  it is then recorded under what is known, the service name and the trace id), or
- the trace holds MAX_HELD_PER_TRACE spans.

Every export locks the traces it touches (a transaction-scoped advisory lock per tenant and
trace, taken in one order), so a child and its root sent concurrently cannot miss each other:
the second to lock sees what the first committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.db.models import Count, Min
from django.utils import timezone
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from memory.models import OtelHeldSpan, Tenant

HOLD_SECONDS = 120.0
MAX_HELD_PER_TRACE = 1000
STALE_TRACES_PER_EXPORT = 200  # bounds the work (and the transaction) one export adds
PARENT_IS_REMOTE = 0x300  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


@dataclass
class Received:
    """A span to record, with the resource it came under and the agent its sender's key is bound to."""

    span: Span
    resource: dict
    bound_agent: str = ""

    @property
    def trace_hex(self) -> str:
        return self.span.trace_id.hex()

    @property
    def is_root(self) -> bool:
        return not any(self.span.parent_span_id) or self.span.flags & PARENT_IS_REMOTE == PARENT_IS_REMOTE


def well_formed(span: Span) -> bool:
    return len(span.trace_id) == 16 and len(span.span_id) == 8 and any(span.trace_id) and any(span.span_id)


def traces_lock(*, tenant: Tenant, traces: Iterable[str]) -> None:
    """Serialise exports of the same traces until this transaction ends (sorted: no deadlock)."""
    keys = sorted({f"otel:{tenant.pk}:{trace}" for trace in traces})
    if not keys:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) "
            "FROM (SELECT k FROM unnest(%s::text[]) AS k ORDER BY k) AS sorted",
            [keys],
        )


def stale_traces(*, tenant: Tenant) -> set[str]:
    """Traces whose hold is over: the oldest held span passed HOLD_SECONDS, or too many are held."""
    cutoff = timezone.now() - timedelta(seconds=HOLD_SECONDS)
    rows = (
        OtelHeldSpan.objects.filter(tenant=tenant)
        .values("trace_id")
        .annotate(oldest=Min("received_at"), held=Count("id"))
        .order_by("oldest")
    )
    stale = [row["trace_id"] for row in rows if row["oldest"] < cutoff or row["held"] >= MAX_HELD_PER_TRACE]
    return set(stale[:STALE_TRACES_PER_EXPORT])


def held_spans(*, tenant: Tenant, traces: Iterable[str]) -> list[Received]:
    rows = OtelHeldSpan.objects.filter(tenant=tenant, trace_id__in=list(traces)).order_by("id")
    return [
        Received(span=Span.FromString(bytes(row.span)), resource=row.resource, bound_agent=row.bound_agent)
        for row in rows
    ]


def held_release(*, tenant: Tenant, traces: Iterable[str]) -> None:
    OtelHeldSpan.objects.filter(tenant=tenant, trace_id__in=list(traces)).delete()


def spans_hold(*, tenant: Tenant, spans: list[Received]) -> None:
    """Hold spans (a resent span already held is held once)."""
    OtelHeldSpan.objects.bulk_create(
        [
            OtelHeldSpan(
                tenant=tenant,
                trace_id=item.trace_hex,
                span_id=item.span.span_id.hex(),
                span=item.span.SerializeToString(),
                resource=item.resource,
                bound_agent=item.bound_agent,
            )
            for item in spans
        ],
        ignore_conflicts=True,
    )


def tenants_with_stale_holds() -> list[int]:
    cutoff = timezone.now() - timedelta(seconds=HOLD_SECONDS)
    return list(
        OtelHeldSpan.objects.filter(received_at__lt=cutoff).values_list("tenant_id", flat=True).distinct()
    )
