"""The flight recorder: append events, read them back.

Events are append-only; nothing here updates one. `events_append` is the one way to write
events: it runs inside the caller's transaction, so an event exists exactly when the write it
records exists, and hands them to the tenant's dashboards after commit (memory.services.broadcast).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from memory.exceptions import InvalidInput, PayloadTooLarge
from memory.models import Agent, Event, EventStream, Session, Tenant
from memory.services import broadcast

TENANT_STREAM = "tenant"

# Reserve `n` consecutive seqs on a stream and return the last one. The upsert takes the stream
# row's lock until the transaction ends: concurrent writers of one stream queue here, so seqs are
# gapless, and a rolled-back transaction gives its seqs back.
_STREAM_RESERVE_SQL = (
    f"INSERT INTO {EventStream._meta.db_table} AS s (tenant_id, key, last_seq) VALUES (%s, %s, %s) "
    "ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = s.last_seq + EXCLUDED.last_seq "
    "RETURNING last_seq"
)


def stream_key(agent: Agent | None) -> str:
    return f"agent:{agent.external_id}" if agent is not None else TENANT_STREAM


def _stream_reserve(*, tenant: Tenant, key: str, count: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_STREAM_RESERVE_SQL, [tenant.pk, key, count])
        return int(cursor.fetchone()[0])


def stream_lock(*, tenant: Tenant, agent: Agent | None = None, session: Session | None = None) -> None:
    """Take the lock of the agent's stream counter (a session's agent when only the session is
    given, the tenant stream without either, as `events_append` picks it) now, until the
    transaction ends: for a write that appends to the stream after locking other rows, so that
    concurrent writers wait here, before any of those, instead of each holding some of them."""
    streams_lock(tenant=tenant, sessions=[session], agents=[agent])


def streams_lock(
    *, tenant: Tenant, sessions: Iterable[Session | None] = (), agents: Iterable[Agent | None] = ()
) -> None:
    """`stream_lock` for each distinct stream of `sessions` (their agents') and `agents`, in one
    order (by key) for every caller, so that two writers that each lock several streams queue
    instead of waiting crosswise.

    THE RULE: a transaction that locks other rows (an experience, say) and appends events takes
    its streams first. Taken only at the first event, a stream is held while the transaction
    waits for a row another writer holds, and that writer may be waiting for the stream."""
    owners = [*agents, *(session.agent if session is not None else None for session in sessions)]
    for key in sorted({stream_key(agent) for agent in owners}):
        _stream_reserve(tenant=tenant, key=key, count=0)


# The OpenTelemetry GenAI ids an event's payload carries: (payload key, the object it is read
# from, its attribute, whether an empty value is kept).
OTEL_FIELDS: tuple[tuple[str, str, str, bool], ...] = (
    ("gen_ai.agent.id", "agent", "external_id", True),
    ("gen_ai.conversation.id", "session", "public_id", True),
    ("gen_ai.request.model", "session", "model_name", False),
)


def _otel_fields(agent: Agent | None, session: Session | None) -> dict[str, Any]:
    sources: dict[str, Agent | Session | None] = {"agent": agent, "session": session}
    fields: dict[str, Any] = {}
    for key, source, attribute, keep_empty in OTEL_FIELDS:
        instance = sources[source]
        if instance is None:
            continue
        value = getattr(instance, attribute)
        if value or keep_empty:
            fields[key] = value
    return fields


def event_append(
    *,
    tenant: Tenant,
    type: str,
    payload: dict[str, Any] | None = None,
    agent: Agent | None = None,
    session: Session | None = None,
) -> Event:
    """Append one event (see events_append)."""
    return events_append(tenant=tenant, entries=[(type, payload or {})], agent=agent, session=session)[0]


def events_append(
    *,
    tenant: Tenant,
    entries: list[tuple[str, dict[str, Any]]],
    agent: Agent | None = None,
    session: Session | None = None,
    created_at: datetime | None = None,
) -> list[Event]:
    """Append events (type, payload) to the agent's stream (the tenant stream when there is no
    agent; a session's agent when only the session is given), with consecutive gapless seqs, in
    this order. Every write that records events calls this.

    Must run inside `transaction.atomic()` together with the write it records. Each payload gets
    the OpenTelemetry GenAI ids (`gen_ai.agent.id`, `gen_ai.conversation.id`,
    `gen_ai.request.model`) of the agent and session. Two statements (the stream's seqs, the
    rows); the events go to the tenant's dashboards after commit.
    """
    if not entries:
        return []
    if not connection.in_atomic_block:
        raise RuntimeError("events_append must run inside the transaction of the write it records")
    if agent is None and session is not None:
        agent = session.agent
    events = events_build(tenant=tenant, entries=entries, agent=agent, session=session, created_at=created_at)
    last = _stream_reserve(tenant=tenant, key=events[0].stream, count=len(events))
    for offset, event in enumerate(events, start=last - len(events) + 1):
        event.seq = offset
    Event.objects.bulk_create(events)
    broadcast.on_commit(tenant.pk, [event_summary(event) for event in events])
    return events


def events_build(
    *,
    tenant: Tenant,
    entries: list[tuple[str, dict[str, Any]]],
    agent: Agent | None = None,
    session: Session | None = None,
    created_at: datetime | None = None,
) -> list[Event]:
    """The unsaved events (type, payload) of one stream with their OpenTelemetry ids (see
    events_append), recorded now (or at `created_at`); their seqs are given when appended."""
    key = stream_key(agent)
    otel = _otel_fields(agent, session)
    now = created_at or timezone.now()
    return [
        Event(
            tenant=tenant,
            stream=key,
            seq=0,
            type=type,
            agent=agent,
            session=session,
            payload={**otel, **payload},
            created_at=now,
        )
        for type, payload in entries
    ]


def event_summary(event: Event) -> dict[str, Any]:
    """The small form of an event that dashboards receive live."""
    return {
        "id": event.public_id,
        "stream": event.stream,
        "seq": event.seq,
        "type": event.type,
        "session": event.payload.get("gen_ai.conversation.id"),
        "agent": event.payload.get("gen_ai.agent.id"),
        "created_at": event.created_at.isoformat(),
    }


def payload_size(payload: Any) -> int:
    return len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())


def events_since(*, tenant: Tenant, agent: Agent, after_seq: int = 0, limit: int = 100) -> list[Event]:
    """Events of the agent's stream with seq > after_seq, oldest first. Read-only."""
    return list(
        Event.objects.filter(tenant=tenant, stream=stream_key(agent), seq__gt=after_seq).order_by("seq")[
            :limit
        ]
    )


AGENT_EVENT_PREFIX = "agent."
AGENT_EVENT_TYPE = re.compile(r"^agent\.[a-z0-9_]+(?:[.\-][a-z0-9_]+)*$")


def events_list(
    *,
    tenant: Tenant,
    agent: Agent,
    after_seq: int = 0,
    limit: int = 100,
    types: list[str] | None = None,
    session: Session | None = None,
) -> list[Event]:
    """Events of the agent's stream with seq > after_seq, oldest first. Read-only.

    `types` filters by type; an entry ending in `*` (`agent.*`) matches a prefix. `session`
    keeps the events of one session.
    """
    queryset = Event.objects.filter(tenant=tenant, stream=stream_key(agent), seq__gt=after_seq)
    if session is not None:
        queryset = queryset.filter(session=session)
    if types:
        condition = Q()
        for entry in types:
            condition |= Q(type__startswith=entry[:-1]) if entry.endswith("*") else Q(type=entry)
        queryset = queryset.filter(condition)
    return list(queryset.select_related("session").order_by("seq")[:limit])


def event_emit(
    *,
    tenant: Tenant,
    agent: Agent,
    type: str,
    payload: dict[str, Any],
    session: Session | None = None,
) -> Event:
    """Record an event the agent itself emits (type `agent.*`, payload ≤ CTXAPP_EVENT_PAYLOAD_MAX_BYTES).

    Raises InvalidInput (422, field `type`) for a type outside `agent.*`, PayloadTooLarge (413,
    field `payload`) for a payload over the limit. Not idempotent on its own (the API's
    Idempotency-Key makes retries safe). Broadcasts after commit.
    """
    if not AGENT_EVENT_TYPE.match(type) or len(type) > 100:
        raise InvalidInput(
            f"An agent's event type must start with {AGENT_EVENT_PREFIX!r} and use lowercase dotted words "
            f"(e.g. 'agent.tool.called'), at most 100 characters; got {type!r}.",
            details={"fields": {"type": ["Must match agent.<name>[.<name>…]."]}},
        )
    limit = settings.CTXAPP.event_payload_max_bytes
    size = payload_size(payload)
    if size > limit:
        raise PayloadTooLarge(
            f"The event payload is {size} bytes; the limit is {limit} bytes (JSON, UTF-8).",
            details={"field": "payload", "size_bytes": size, "limit_bytes": limit},
        )
    if session is not None and session.agent_id != agent.pk:
        raise InvalidInput(
            f"Session {session.public_id} belongs to another agent.",
            details={"fields": {"session": ["Belongs to another agent."]}},
        )
    with transaction.atomic():
        return event_append(tenant=tenant, type=type, payload=payload, agent=agent, session=session)
