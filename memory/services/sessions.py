"""Agents, sessions and messages: the write side of every agent turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from memory.exceptions import NotFound, SessionEnded
from memory.models import Agent, Message, Session, SessionStatus, Tenant
from memory.services import recorder, tokens

DEFAULT_SESSION_TTL = timedelta(hours=24)


def agent_get_or_create(*, tenant: Tenant, external_id: str) -> Agent:
    """The tenant's agent with this external id, created on first use. Safe under concurrency."""
    agent = Agent.objects.filter(tenant=tenant, external_id=external_id).first()
    if agent is not None:
        return agent
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Agent._meta.db_table} (tenant_id, external_id, created_at, metadata) "
            "VALUES (%s, %s, %s, '{}') ON CONFLICT (tenant_id, external_id) DO NOTHING",
            [tenant.pk, external_id, timezone.now()],
        )
    return Agent.objects.get(tenant=tenant, external_id=external_id)


def agent_get(*, tenant: Tenant, external_id: str) -> Agent:
    """The tenant's agent, or NotFound (also for another tenant's agent)."""
    agent = Agent.objects.filter(tenant=tenant, external_id=external_id).first()
    if agent is None:
        raise NotFound.of("agent", external_id)
    return agent


def session_get(*, tenant: Tenant, session_id: str) -> Session:
    """The tenant's session, or NotFound — identical for a missing id and another tenant's id."""
    session = Session.objects.select_related("agent").filter(tenant=tenant, public_id=session_id).first()
    if session is None:
        raise NotFound.of("session", session_id)
    return session


@transaction.atomic
def session_create(
    *,
    tenant: Tenant,
    agent_external_id: str,
    user_id: str = "",
    model_name: str = "",
    metadata: dict[str, Any] | None = None,
    ttl: timedelta = DEFAULT_SESSION_TTL,
) -> Session:
    """Open a session for the agent (created on first use). Records `session.created`."""
    agent = agent_get_or_create(tenant=tenant, external_id=agent_external_id)
    now = timezone.now()
    session = Session.objects.create(
        tenant=tenant,
        agent=agent,
        user_id=user_id,
        model_name=model_name,
        metadata=metadata or {},
        created_at=now,
        last_accessed_at=now,
        expires_at=now + ttl,
    )
    recorder.event_append(
        tenant=tenant,
        type="session.created",
        agent=agent,
        session=session,
        payload={"user_id": user_id},
    )
    return session


@dataclass
class MessageInput:
    role: str
    content: str = ""
    turn_id: str = ""
    tool_call_id: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    event_kind: str = ""
    parent_seq: int | None = None
    artifact_refs: list[Any] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)


def message_token_count(item: MessageInput) -> int:
    """Tokens of a message's content and tool calls (o200k; the context engine refines per model)."""
    import json

    text = item.content
    if item.tool_calls:
        text += json.dumps(item.tool_calls, separators=(",", ":"), ensure_ascii=False)
    return tokens.count_tokens(text)


@transaction.atomic
def messages_append(*, tenant: Tenant, session: Session, items: list[MessageInput]) -> list[Message]:
    """Append messages to an open session, all or nothing, with gapless consecutive seqs.

    The seq counter lives on the session row and is advanced by one UPDATE that takes the
    row's lock: concurrent appenders queue on it, and a rolled-back append gives its seqs back.
    Records one `message.added` event per message. Raises SessionEnded if the session is not open.
    """
    if not items:
        return []
    counts = [message_token_count(item) for item in items]  # outside the lock: the slow part
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Session._meta.db_table} SET message_seq = message_seq + %s, "
            "message_count = message_count + %s, token_count = token_count + %s, last_accessed_at = %s "
            "WHERE id = %s AND status = %s RETURNING message_seq",
            [len(items), len(items), sum(counts), now, session.pk, SessionStatus.OPEN],
        )
        row = cursor.fetchone()
    if row is None:
        raise SessionEnded(details={"session": session.public_id})
    first = int(row[0]) - len(items) + 1
    messages = [
        Message(
            tenant=tenant,
            session=session,
            seq=first + index,
            role=item.role,
            content=item.content,
            token_count=count,
            turn_id=item.turn_id,
            tool_call_id=item.tool_call_id,
            tool_calls=item.tool_calls,
            event_kind=item.event_kind,
            parent_seq=item.parent_seq,
            artifact_refs=item.artifact_refs,
            metadata=item.metadata,
            created_at=now,
        )
        for index, (item, count) in enumerate(zip(items, counts, strict=True))
    ]
    Message.objects.bulk_create(messages)
    session.message_seq = first + len(items) - 1
    session.last_accessed_at = now
    recorder.event_append_many(
        tenant=tenant,
        type="message.added",
        agent=session.agent,
        session=session,
        payloads=[
            {"seq": m.seq, "role": m.role, "tokens": m.token_count, "event_kind": m.event_kind} for m in messages
        ],
    )
    from memory.services import decay

    decay.facts_observe_messages(tenant=tenant, session=session, messages=messages)
    return messages
