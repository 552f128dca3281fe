"""The flight recorder: append events, read them back.

Events are append-only; nothing here updates one. Every append runs inside the caller's
transaction, so an event exists exactly when the write it records exists, and each event is
pushed to the tenant's dashboards after commit (memory.broadcast).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection

from memory import broadcast
from memory.models import Agent, Event, EventStream, Session, Tenant

TENANT_STREAM = "tenant"


def stream_key(agent: Agent | None) -> str:
    return f"agent:{agent.external_id}" if agent is not None else TENANT_STREAM


def _allocate_seqs(*, tenant: Tenant, key: str, count: int) -> int:
    """Reserve `count` consecutive seqs on a stream; return the first.

    The upsert takes the stream row's lock until the transaction ends, so concurrent writers
    queue up and seqs are gapless: a rolled-back transaction gives its seqs back.
    """
    table = EventStream._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, key, last_seq) VALUES (%s, %s, %s) "
            f"ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = {table}.last_seq + EXCLUDED.last_seq "
            "RETURNING last_seq",
            [tenant.pk, key, count],
        )
        last = cursor.fetchone()[0]
    return int(last) - count + 1


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
    return event_append_many(tenant=tenant, type=type, payloads=[payload or {}], agent=agent, session=session)[0]


def event_append_many(
    *,
    tenant: Tenant,
    type: str,
    payloads: list[dict[str, Any]],
    agent: Agent | None = None,
    session: Session | None = None,
) -> list[Event]:
    """Append several events of one type to one stream with consecutive seqs (see event_append)."""
    if not connection.in_atomic_block:
        raise RuntimeError("event_append must run inside the transaction of the write it records")
    if agent is None and session is not None:
        agent = session.agent
    key = stream_key(agent)
    first = _allocate_seqs(tenant=tenant, key=key, count=len(payloads))
    otel = _otel_fields(agent, session)
    events = [
        Event(
            tenant=tenant,
            stream=key,
            seq=first + index,
            type=type,
            agent=agent,
            session=session,
            payload={**otel, **payload},
        )
        for index, payload in enumerate(payloads)
    ]
    Event.objects.bulk_create(events)
    for event in events:
        broadcast.on_commit(tenant.pk, event_summary(event))
    return events


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
        Event.objects.filter(tenant=tenant, stream=stream_key(agent), seq__gt=after_seq).order_by("seq")[:limit]
    )
