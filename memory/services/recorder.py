"""The flight recorder: append events, read them back.

Events are append-only; nothing here updates one. Every append runs inside the caller's
transaction, so an event exists exactly when the write it records exists, and each event is
pushed to the tenant's dashboards after commit (ctxapp.infra.broadcast).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.conf import settings
from django.db import connection, models, transaction
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


# The stored columns of an event row (the primary key aside), from the model: every way of inserting
# events below fills exactly these, so a field added to Event fails here instead of being skipped.
_EVENT_COLUMNS = [f for f in Event._meta.concrete_fields if not f.primary_key]


def _event_insert_sql(values: Mapping[str, str], source: str) -> str:
    """`INSERT INTO <event> (columns) SELECT <values> FROM <source> RETURNING public_id, id, seq`:
    `values` gives each column's SQL expression, by attribute name."""
    missing = {f.attname for f in _EVENT_COLUMNS} ^ set(values)
    if missing:
        raise ValueError(
            f"an event insert must give exactly the event's columns; differs in {sorted(missing)}"
        )
    return (
        f"INSERT INTO {Event._meta.db_table} ({', '.join(str(f.column) for f in _EVENT_COLUMNS)}) "
        f"SELECT {', '.join(values[f.attname] for f in _EVENT_COLUMNS)} FROM {source} "
        "RETURNING public_id, id, seq"
    )


_STREAM_SEQS_SQL = (
    f"s AS (INSERT INTO {EventStream._meta.db_table} (tenant_id, key, last_seq) VALUES (%s, %s, %s) "
    f"ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = {EventStream._meta.db_table}.last_seq "
    "+ EXCLUDED.last_seq RETURNING last_seq)"
)
_EVENTS_SQL = _event_insert_sql(
    {
        "tenant_id": "%s",
        "public_id": "e.public_id",
        "stream": "%s",
        "seq": "s.last_seq - %s + e.ord",
        "type": "e.type",
        "agent_id": "%s",
        "session_id": "%s",
        "payload": "e.payload",
        "created_at": "%s",
    },
    "s, unnest(%s::varchar[], %s::varchar[], %s::jsonb[]) WITH ORDINALITY "
    "AS e(public_id, type, payload, ord)",
)


def events_insert_cte(*, tenant: Tenant, key: str, events: list[Event]) -> tuple[str, list[Any]]:
    """Two CTEs, `s` and `e` (SQL and parameters), that reserve consecutive seqs on stream `key`
    and insert `events` with them; `e` returns (public_id, id, seq), `s` the stream's last seq.

    The upsert of the stream's counter takes its row lock until the transaction ends, so
    concurrent writers queue up and seqs are gapless: a rolled-back transaction gives its seqs
    back. Callers put more in the same statement (checkpoint_create) or read `e` (_insert_events).
    """
    first = events[0]
    params = [
        tenant.pk, key, len(events),
        tenant.pk, key, len(events), first.agent_id, first.session_id, first.created_at,
        [e.public_id for e in events], [e.type for e in events],
        [json.dumps(e.payload) for e in events],
    ]  # fmt: skip
    return f"{_STREAM_SEQS_SQL}, e AS ({_EVENTS_SQL})", params


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


# The OpenTelemetry GenAI ids an event's payload carries: (payload key, the object it is read
# from, its attribute, whether an empty value is kept). events_build reads them from the objects,
# StatementEvents from a statement's columns: one definition for both.
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


def _column(model: type[models.Model], name: str) -> str:
    return str(cast("models.Field[Any, Any]", model._meta.get_field(name)).column)


def _otel_fields_sql(columns: Mapping[str, str]) -> str:
    """The OTel fields as a jsonb expression, each read from the column `columns[source]` formats."""
    parts = []
    for key, source, attribute, keep_empty in OTEL_FIELDS:
        column = columns[source].format(_column(Agent if source == "agent" else Session, attribute))
        part = f"jsonb_build_object('{key}', {column})"
        parts.append(part if keep_empty else f"CASE WHEN {column} <> '' THEN {part} ELSE '{{}}'::jsonb END")
    return " || ".join(parts)


@dataclass(frozen=True)
class StatementEvents:
    """The events of a write that records them inside its own SQL statement (one round trip for
    the write, the stream's seqs and the events): the statement's event part, built from the
    definitions every other event is made of (the row's columns from the model, OTEL_FIELDS, the
    summary of event_summary), its parameters (named, `event_…`), and the live update.

    The statement supplies SQL expressions over its FROM list `rows` (one row per event, one
    agent and one session): `ordinal`, 1..n in the events' order; `stream`, the stream's key;
    `stream_seq`, the stream's seq before the first event; `columns`, for "agent" and "session", a
    format string that gives a column of that row (`"s.{}"`); `payload`, the event's own payload
    keys (the OTel fields are added as events_build adds them).
    """

    type: str
    rows: str
    ordinal: str
    stream: str
    stream_seq: str
    columns: Mapping[str, str]
    payload: Mapping[str, str]

    @functools.cached_property
    def insert_sql(self) -> str:
        """The INSERT (for a CTE) that returns (public_id, id, seq) per event."""
        own = ", ".join(f"'{key}', {expression}" for key, expression in self.payload.items())
        session = self.columns["session"]
        return _event_insert_sql(
            {
                "tenant_id": "%(event_tenant)s",
                "public_id": f"(%(event_public_ids)s::varchar[])[{self.ordinal}]",
                "stream": self.stream,
                "seq": f"{self.stream_seq} + {self.ordinal}",
                "type": "%(event_type)s",
                "agent_id": session.format(_column(Session, "agent")),
                "session_id": session.format(_column(Session, "id")),
                "payload": f"({_otel_fields_sql(self.columns)}) || jsonb_build_object({own})",
                "created_at": "%(event_created_at)s",
            },
            self.rows,
        )

    def params(self, *, tenant: Tenant, count: int, now: datetime) -> dict[str, Any]:
        """The parameters of insert_sql for `count` events recorded at `now`."""
        new_public_id = Event._meta.get_field("public_id").get_default
        return {
            "event_tenant": tenant.pk,
            "event_type": self.type,
            "event_created_at": now,
            "event_public_ids": [new_public_id() for _ in range(count)],
        }

    def listening(self, tenant: Tenant) -> tuple[str, dict[str, Any]]:
        """Whether the tenant's dashboards listen, for the statement to return (listeners_probe)."""
        probe = broadcast.listeners_sql(tenant.pk, "%(event_listeners)s")
        return ("true", {}) if probe is None else (probe[0], {"event_listeners": probe[1]})

    def broadcast(
        self,
        *,
        tenant: Tenant,
        agent: Agent,
        session: Session,
        payloads: list[dict[str, Any]],
        params: dict[str, Any],
        rows: Iterable[tuple[str, int, int]],
    ) -> None:
        """Push the events the statement inserted to the tenant's dashboards after commit: their
        event_summary, from the payload events_build gives them (`payloads`: each one's own
        payload, as the statement computed it) and the (public_id, id, seq) rows it returned.
        No Event object is built: a batch of 1,000 messages would pay for 1,000 of them."""
        otel = _otel_fields(agent, session)
        stream, created_at = stream_key(agent), params["event_created_at"].isoformat()
        for payload, (public_id, _, seq) in zip(payloads, rows, strict=True):
            summary = _summary(public_id, stream, seq, self.type, {**otel, **payload}, created_at)
            broadcast.on_commit(tenant.pk, summary)


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
    created_at: datetime | None = None,
) -> list[Event]:
    """The unsaved events (type, payload) of one stream, with their OpenTelemetry ids (see
    event_append), recorded now (or at `created_at`); insert them with events_insert_cte, then
    events_inserted and events_broadcast."""
    if not connection.in_atomic_block:
        raise RuntimeError("event_append must run inside the transaction of the write it records")
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


def events_broadcast(tenant: Tenant, events: list[Event]) -> None:
    """Push `events` (inserted) to the tenant's dashboards after commit."""
    for event in events:
        broadcast.on_commit(tenant.pk, event_summary(event))


def event_summary(event: Event) -> dict[str, Any]:
    """The small form of an event that dashboards receive live."""
    return _summary(
        event.public_id, event.stream, event.seq, event.type, event.payload, event.created_at.isoformat()
    )


def _summary(
    public_id: str, stream: str, seq: int, type: str, payload: dict[str, Any], created_at: str
) -> dict[str, Any]:
    return {
        "id": public_id,
        "stream": stream,
        "seq": seq,
        "type": type,
        "session": payload.get("gen_ai.conversation.id"),
        "agent": payload.get("gen_ai.agent.id"),
        "created_at": created_at,
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
