"""The flight recorder: append events, read them back.

Events are append-only; nothing here updates one. Every append runs inside the caller's
transaction, so an event exists exactly when the write it records exists, and each event is
pushed to the tenant's dashboards after commit (ctxapp.infra.broadcast).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ctxapp.infra import broadcast
from ctxapp.infra.prepared import prepared_cursor
from memory.exceptions import InvalidInput, PayloadTooLarge
from memory.models import Agent, Event, EventStream, Session, Tenant

TENANT_STREAM = "tenant"


def stream_key(agent: Agent | None) -> str:
    return f"agent:{agent.external_id}" if agent is not None else TENANT_STREAM


def stream_lock(*, tenant: Tenant, agent: Agent | None) -> None:
    """Take the lock of the agent's stream counter (the tenant stream without one) now, until the
    transaction ends: for a write that appends to the stream after locking other rows, so that
    concurrent writers wait here, before any of those, instead of each holding some of them."""
    streams = EventStream._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {streams} (tenant_id, key, last_seq) VALUES (%s, %s, 0) "
            f"ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = {streams}.last_seq",
            [tenant.pk, stream_key(agent)],
        )


def events_insert_cte(*, tenant: Tenant, key: str, events: list[Event]) -> tuple[str, list[Any]]:
    """Two CTEs, `s` and `e` (SQL and parameters), that reserve consecutive seqs on stream `key`
    and insert `events` with them; `e` returns (public_id, id, seq), `s` the stream's last seq.

    The upsert of the stream's counter takes its row lock until the transaction ends, so
    concurrent writers queue up and seqs are gapless: a rolled-back transaction gives its seqs
    back. Callers put more in the same statement (checkpoint_create) or read `e` (_insert_events).
    """
    streams, table = EventStream._meta.db_table, Event._meta.db_table
    first = events[0]
    sql = (
        f"s AS (INSERT INTO {streams} (tenant_id, key, last_seq) VALUES (%s, %s, %s) "
        f"ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = {streams}.last_seq + EXCLUDED.last_seq "
        "RETURNING last_seq), "
        f"e AS (INSERT INTO {table} "
        "(tenant_id, public_id, stream, seq, type, agent_id, session_id, payload, created_at) "
        "SELECT %s, e.public_id, %s, s.last_seq - %s + e.ord, e.type, %s, %s, e.payload, %s "
        "FROM s, unnest(%s::varchar[], %s::varchar[], %s::jsonb[]) WITH ORDINALITY "
        "AS e(public_id, type, payload, ord) "
        "RETURNING public_id, id, seq)"
    )
    params = [
        tenant.pk, key, len(events),
        tenant.pk, key, len(events), first.agent_id, first.session_id, first.created_at,
        [e.public_id for e in events], [e.type for e in events],
        [json.dumps(e.payload) for e in events],
    ]  # fmt: skip
    return sql, params


def events_inserted(events: list[Event], rows: Iterable[tuple[str, int, int]]) -> None:
    """Give `events` the (public_id, id, seq) rows their insert returned; sort them by seq."""
    assigned = {public_id: (pk, seq) for public_id, pk, seq in rows}
    for event in events:
        event.pk, event.seq = assigned[event.public_id]
    events.sort(key=lambda e: e.seq)


def _insert_events(*, tenant: Tenant, key: str, events: list[Event]) -> bool:
    """Reserve consecutive seqs on stream `key` and insert `events` with them, in ONE statement
    (events_insert_cte): one round trip instead of two (counter, then rows). Returns whether a
    dashboard of the tenant listens (asked in the same statement)."""
    sql, params = events_insert_cte(tenant=tenant, key=key, events=events)
    listening, listening_params = listeners_probe(tenant)
    with prepared_cursor() as cursor:
        cursor.execute(
            f"WITH {sql} SELECT public_id, id, seq, {listening} FROM e", [*params, *listening_params]
        )
        rows = cursor.fetchall()
    events_inserted(events, (row[:3] for row in rows))
    return bool(rows[0][3])


def listeners_probe(tenant: Tenant) -> tuple[str, list[Any]]:
    """Whether the tenant's dashboards listen, for a write's own statement to return (SQL and its
    parameters, `%s` style): `true` when the channel layer cannot be asked (ctxapp.infra.broadcast)."""
    probe = broadcast.listeners_sql(tenant.pk)
    return ("true", []) if probe is None else (probe[0], [probe[1]])


def _otel_fields(agent: Agent | None, session: Session | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if agent is not None:
        fields["gen_ai.agent.id"] = agent.external_id
    if session is not None:
        fields["gen_ai.conversation.id"] = session.public_id
        if session.model_name:
            fields["gen_ai.request.model"] = session.model_name
    return fields


def event_append(
    *,
    tenant: Tenant,
    type: str,
    payload: dict[str, Any] | None = None,
    agent: Agent | None = None,
    session: Session | None = None,
) -> Event:
    """Append one event to the agent's stream (or the tenant stream when there is no agent).

    Must be called inside `transaction.atomic()` together with the write it records.
    The payload gets the OpenTelemetry GenAI ids (`gen_ai.agent.id`, `gen_ai.conversation.id`,
    `gen_ai.request.model`) of the agent and session. Broadcasts after commit.
    """
    return event_append_many(
        tenant=tenant, type=type, payloads=[payload or {}], agent=agent, session=session
    )[0]


def event_append_many(
    *,
    tenant: Tenant,
    type: str,
    payloads: list[dict[str, Any]],
    agent: Agent | None = None,
    session: Session | None = None,
) -> list[Event]:
    """Append several events of one type to one stream with consecutive seqs (see event_append)."""
    return events_append(
        tenant=tenant, entries=[(type, payload) for payload in payloads], agent=agent, session=session
    )


def events_append(
    *,
    tenant: Tenant,
    entries: list[tuple[str, dict[str, Any]]],
    agent: Agent | None = None,
    session: Session | None = None,
) -> list[Event]:
    """Append events (type, payload) to one stream with consecutive seqs, in this order, in one
    statement (see event_append)."""
    if agent is None and session is not None:
        agent = session.agent
    events = events_build(tenant=tenant, entries=entries, agent=agent, session=session)
    if not events:
        return []
    if _insert_events(tenant=tenant, key=stream_key(agent), events=events):
        events_broadcast(tenant, events)
    return events


def events_build(
    *,
    tenant: Tenant,
    entries: list[tuple[str, dict[str, Any]]],
    agent: Agent | None = None,
    session: Session | None = None,
) -> list[Event]:
    """The unsaved events (type, payload) of one stream, with their OpenTelemetry ids (see
    event_append); insert them with events_insert_cte, then events_inserted and events_broadcast."""
    if not connection.in_atomic_block:
        raise RuntimeError("event_append must run inside the transaction of the write it records")
    key = stream_key(agent)
    otel = _otel_fields(agent, session)
    now = timezone.now()
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


def events_broadcast(tenant: Tenant, events: list[Event]) -> None:
    """Push `events` (inserted) to the tenant's dashboards after commit."""
    for event in events:
        broadcast.on_commit(tenant.pk, event_summary(event))


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
