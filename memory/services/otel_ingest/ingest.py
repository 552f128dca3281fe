"""Decoded spans recorded: the agent and conversation of each span, its unseen messages, its
`otel.<operation>` event and usage report, one savepoint per span. Writes."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from memory.exceptions import AgentMismatch, DomainError, InvalidInput
from memory.models import (
    Agent,
    Message,
    OtelConversation,
    OtelSpan,
    Session,
    SessionStatus,
    Tenant,
)
from memory.services import recorder, sessions
from memory.services.otel_ingest import holding
from memory.services.otel_ingest.attributes import (
    as_text,
    attributes_dict,
    clean_text,
    span_attributes,
)
from memory.services.otel_ingest.conversations import continued_session, history_digests, message_mark
from memory.services.otel_ingest.holding import Received
from memory.services.otel_ingest.messages import fingerprint, span_messages
from memory.services.otel_ingest.usage import span_usage, usage_record
from memory.services.otel_ingest.wire import IngestResult

DEFAULT_AGENT = "otel"
CONVERSATION_ID_MAX_LENGTH = 255
OPERATION_NAME = re.compile(r"[^a-z0-9_]+")


@dataclass
class _Conversation:
    session: Session
    seen: Counter[str]
    digest: str = ""  # history_digests of the session's messages, in seq order


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
    cache: dict[tuple[int, str], _Conversation], history: list[sessions.MessageInput] | None = None,
) -> _Conversation:  # fmt: skip
    """The conversation's session, opened on first sight. `history`: the conversation is a trace
    that names none, whose first call re-sent this history; the session it extends, if any,
    continues (see conversations.continued_session)."""
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
    if row is None and history:
        session = continued_session(tenant=tenant, agent=agent, history=history, user_id=user_id)
        if session is not None:
            row = OtelConversation.objects.create(
                tenant=tenant, agent=agent, conversation_id=conversation_id, session=session
            )
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
    marks = [
        fingerprint(role, content, tool_call_id, tool_calls)
        for role, content, tool_call_id, tool_calls in Message.objects.filter(session=session)
        .order_by("seq")
        .values_list("role", "content", "tool_call_id", "tool_calls")
    ]
    digests = history_digests(marks)
    cache[key] = _Conversation(session=session, seen=Counter(marks), digest=digests[-1] if digests else "")
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


def _trace_hints(spans: list[Received]) -> dict[str, dict[str, str]]:
    """Per trace id: the agent and conversation some span of it names (others inherit them)."""
    hints: dict[str, dict[str, str]] = {}
    for item in spans:
        attrs = span_attributes(item.span)
        hint = hints.setdefault(item.trace_hex, {})
        agent = attrs.get("gen_ai.agent.name") or attrs.get("gen_ai.agent.id")
        conversation = attrs.get("gen_ai.conversation.id") or attrs.get("session.id")
        if agent and "agent" not in hint and _valid_agent_id(as_text(agent)):
            hint["agent"] = as_text(agent)
        if conversation and "conversation" not in hint:
            hint["conversation"] = as_text(conversation)
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
    known: dict[int, dict[str, str]] = {}  # per session: its conversations and their agents
    for session_id, conversation, agent in rows:
        known.setdefault(session_id, {})[conversation] = agent
    for trace, session_id in sessions_of.items():
        conversations = known.get(session_id)
        if not conversations:
            continue
        # A trace that names no conversation is its own (its session may continue an earlier one's).
        conversation = trace if trace in conversations else next(iter(conversations))
        hints[trace].setdefault("agent", conversations[conversation])
        hints[trace].setdefault("conversation", conversation)
        if conversation == trace:
            hints[trace]["unnamed"] = "yes"


def traces_ingest(
    *,
    tenant: Tenant,
    request: ExportTraceServiceRequest,
    bound_agent: str = "",
    rejected: Sequence[str] = (),
) -> IngestResult:
    """Record a decoded OTLP export. Idempotent per span (trace id + span id, per tenant).

    A span whose trace has not yet said its agent and conversation is held until it does
    (holding.py), so grouping does not depend on export order or batching; held spans of this
    export's traces, and of traces whose hold is over, are recorded with it. Spans are recorded
    in the order they ended (an agent span ends after the model and tool spans inside it). Each
    span is recorded in its own savepoint: a span that cannot be recorded (no GenAI attributes,
    bad ids, an agent id ctxapp refuses) is counted in `rejected` with a reason and leaves
    nothing behind, and the others are still recorded; `rejected` are the reasons of spans the
    decoder left out. Records one `otel.<operation>` event per span, `usage.reported` per span
    with usage, and one `otel.rejected` event on the tenant stream when spans were rejected.
    Broadcasts after commit. With `bound_agent` (the API key is bound to that agent) every span
    is recorded as that agent, and a span naming another agent is rejected.
    """
    result = IngestResult()
    for reason in rejected:
        result.reject(reason)
    received = [
        holding.Received(span=span, resource=attributes_dict(resource_spans.resource.attributes),
                         bound_agent=bound_agent)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    ]  # fmt: skip
    with transaction.atomic():
        ready, hints = _ready_spans(tenant=tenant, received=received, result=result)
        _spans_record(tenant=tenant, spans=ready, hints=hints, result=result)
        if result.rejected:
            recorder.event_append(
                tenant=tenant,
                type="otel.rejected",
                payload={"rejected_spans": result.rejected, "errors": result.errors[:5]},
            )
    return result


def held_spans_flush() -> int:
    """Record the held spans whose hold is over, of every tenant (Celery beat runs it, so that a
    trace whose root never comes is recorded even if its sender sends nothing more). Returns
    the spans recorded."""
    recorded = 0
    for tenant in Tenant.objects.filter(pk__in=holding.tenants_with_stale_holds()):
        recorded += traces_ingest(tenant=tenant, request=ExportTraceServiceRequest()).accepted
    return recorded


def _ready_spans(
    *, tenant: Tenant, received: list[Received], result: IngestResult
) -> tuple[list[Received], dict[str, dict[str, str]]]:
    """The spans to record now (this export's and held ones, of traces that are ready); holds the
    others. Locks every trace it reads (holding.traces_lock) before reading what was recorded."""
    stale = holding.stale_traces(tenant=tenant)
    traces = {item.trace_hex for item in received if holding.well_formed(item.span)}
    holding.traces_lock(tenant=tenant, traces=traces | stale)
    held = holding.held_spans(tenant=tenant, traces=traces | stale)
    everything = held + received
    hints = _trace_hints(everything)
    _trace_hints_recorded(tenant=tenant, hints=hints)
    roots = {item.trace_hex for item in everything if item.is_root}
    named = {trace for trace, hint in hints.items() if {"agent", "conversation"} <= hint.keys()}
    ready_traces = stale | roots | named
    waiting = [
        item
        for item in received
        if holding.well_formed(item.span)
        and item.trace_hex not in ready_traces
        and _has_genai(span_attributes(item.span), item.span)
    ]
    holding.spans_hold(tenant=tenant, spans=waiting)
    result.held += len(waiting)
    holding.held_release(tenant=tenant, traces={item.trace_hex for item in held} & ready_traces)
    waiting_ids = {id(item) for item in waiting}
    ready = [item for item in held if item.trace_hex in ready_traces]
    ready += [item for item in received if id(item) not in waiting_ids]
    return ready, hints


def _spans_record(
    *, tenant: Tenant, spans: list[Received], hints: dict[str, dict[str, str]], result: IngestResult
) -> None:
    spans = sorted(spans, key=lambda item: item.span.end_time_unix_nano or item.span.start_time_unix_nano)
    histories = _trace_histories(spans, hints)
    cache: dict[tuple[int, str], _Conversation] = {}
    agents: dict[str, Agent] = {}
    for item in spans:
        try:
            with transaction.atomic():
                _span_ingest(
                    tenant=tenant, item=item, hints=hints, cache=cache, agents=agents, result=result,
                    history=histories.get(item.trace_hex),
                )  # fmt: skip
        except (DomainError, DataError) as exc:
            # The savepoint rolled back: sessions and agents it created no longer exist. A
            # DataError (a value the database cannot store) is the span's fault, not ours.
            cache.clear()
            agents.clear()
            reason = exc.message if isinstance(exc, DomainError) else "a value cannot be stored"
            result.reject(f"span {item.span.span_id.hex() or '?'}: {reason}")


def _trace_histories(
    spans: list[Received], hints: dict[str, dict[str, str]]
) -> dict[str, list[sessions.MessageInput]]:
    """Per trace that names no conversation: the input history of its first call (the span that
    started first among those with input messages), which may extend an earlier trace's."""
    histories: dict[str, tuple[int, list[sessions.MessageInput]]] = {}
    for item in spans:
        if "conversation" in hints.get(item.trace_hex, {}) or not holding.well_formed(item.span):
            continue
        attrs = span_attributes(item.span)
        if attrs.get("gen_ai.conversation.id") or attrs.get("session.id"):
            continue
        start = item.span.start_time_unix_nano
        if item.trace_hex in histories and histories[item.trace_hex][0] <= start:
            continue
        inputs, _ = span_messages(attrs, item.span, _span_operation(attrs), item.span.span_id.hex())
        if inputs:
            histories[item.trace_hex] = (start, inputs)
    return {trace: inputs for trace, (_, inputs) in histories.items()}


def _span_ingest(
    *,
    tenant: Tenant,
    item: Received,
    hints: dict[str, dict[str, str]],
    cache: dict[tuple[int, str], _Conversation],
    agents: dict[str, Agent],
    result: IngestResult,
    history: list[sessions.MessageInput] | None = None,
) -> None:
    span, resource, bound_agent = item.span, item.resource, item.bound_agent
    trace_hex, span_hex = span.trace_id.hex(), span.span_id.hex()
    if not holding.well_formed(span):
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
    named = (
        attrs.get("gen_ai.conversation.id")
        or attrs.get("session.id")
        or (None if hint.get("unnamed") else hint.get("conversation"))
    )
    conversation_id = as_text(named or trace_hex)[:CONVERSATION_ID_MAX_LENGTH]
    model = as_text(attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model"))
    conversation = _conversation(
        tenant=tenant,
        agent=agent,
        conversation_id=conversation_id,
        user_id=as_text(attrs.get("user.id") or attrs.get("enduser.id")),
        model=model,
        cache=cache,
        history=None if named else history,
    )
    session = conversation.session
    inputs, outputs = span_messages(attrs, span, operation, span_hex)
    new = _unseen_messages(
        conversation, inputs, outputs, operation=operation, trace_hex=trace_hex, span_hex=span_hex
    )
    recorded = sessions.messages_append(tenant=tenant, session=session, items=new) if new else []
    for message in new:
        conversation.seen[message_mark(message)] += 1
    if new and not named:  # a later trace that re-sends this history continues the session
        conversation.digest = history_digests(map(message_mark, new), conversation.digest)[-1]
        OtelConversation.objects.filter(tenant=tenant, session=session).update(
            history_digest=conversation.digest
        )
    OtelSpan.objects.filter(tenant=tenant, trace_id=trace_hex, span_id=span_hex).update(session=session)
    usage = span_usage(attrs)
    payload = _span_payload(
        span, attrs, operation=operation, model=model, usage=usage, seqs=[m.seq for m in recorded]
    )
    recorder.event_append(
        tenant=tenant, type=f"otel.{operation}", agent=agent, session=session, payload=payload
    )
    if usage.get("gen_ai.usage.input_tokens") is not None:
        usage_record(tenant=tenant, session=session, model=model, usage=usage, span_hex=span_hex)
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
    named = as_text(attrs.get("gen_ai.agent.name") or attrs.get("gen_ai.agent.id") or hint.get("agent"))
    if bound_agent and named and named != bound_agent:
        raise AgentMismatch(
            f"the API key is bound to agent {bound_agent!r}; this span names {named!r}",
            details={"bound_agent": bound_agent, "requested_agent": named},
        )
    agent_name = bound_agent or named or as_text(resource.get("service.name")) or DEFAULT_AGENT
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
        mark = fingerprint(message.role, message.content, message.tool_call_id, message.tool_calls)
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
        "name": clean_text(span.name)[:200],
        "gen_ai.operation.name": operation,
        "duration_ms": round(duration_ns / 1e6, 3),
        "start_ms": round(span.start_time_unix_nano / 1e6, 3),  # the trace view's time line
        "status": {0: "unset", 1: "ok", 2: "error"}.get(span.status.code, "unset"),
        "messages": seqs,
    }
    if model:
        payload["gen_ai.request.model"] = model[:200]
    if attrs.get("gen_ai.tool.name"):
        payload["gen_ai.tool.name"] = as_text(attrs["gen_ai.tool.name"])[:200]
    if span.status.message:
        payload["status_message"] = clean_text(span.status.message)[:500]
    payload.update({key: value for key, value in usage.items() if value is not None})
    return payload
