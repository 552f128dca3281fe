"""Appending messages to a session: the hot path of every agent turn.

`messages_append` locks the session row, inserts the messages, records their `message.added`
events (memory.services.recorder), advances the session's counters and lets decay observe the
new turns, in one transaction. The jobs it implies (embedding, extraction of user memories) are
recorded in the same transaction and dispatched after commit (memory.services.jobs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from memory.exceptions import SessionEnded
from memory.models import Message, MessageRole, Session, SessionStatus, Tenant
from memory.selectors.sessions import session_get
from memory.services import decay, jobs, message_indexing, recorder, tokens

MESSAGE_ADDED = "message.added"
# How stale a session's last_accessed_at may get while it is being appended to: a session
# appended to several times a second then rewrites no indexed column (a HOT update).
TOUCH_SECONDS = 1


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
    name: str = ""  # the speaker (indexed with the content)
    occurred_at: datetime | None = None  # when it was said (history imports); default: now


def message_token_count(item: MessageInput) -> int:
    """Tokens of a message's content and tool calls (o200k; the context engine refines per model)."""
    text = item.content
    if item.tool_calls:
        text += json.dumps(item.tool_calls, separators=(",", ":"), ensure_ascii=False)
    return tokens.count_tokens(text)


# What a message's `message.added` event says of it besides the OTel ids: payload key → field.
MESSAGE_EVENT_PAYLOAD = {"seq": "seq", "role": "role", "tokens": "token_count", "event_kind": "event_kind"}


def message_event_payload(message: Message) -> dict[str, Any]:
    """The own payload of a message's `message.added` event (recorder.events_build adds the OTel ids)."""
    return {key: getattr(message, name) for key, name in MESSAGE_EVENT_PAYLOAD.items()}


def messages_append(
    *,
    tenant: Tenant,
    items: list[MessageInput],
    session: Session | None = None,
    session_id: str | None = None,
) -> list[Message]:
    """Append messages to an open session, all or nothing, with gapless consecutive seqs.

    The session is given as an object or by its public id (`session_id`, scoped to the tenant).
    Its row is locked for the transaction: concurrent appenders queue on it, and a rolled-back
    append gives its seqs back. Records one `message.added` event per message (sent to the
    dashboards after commit) and lets decay mark referenced facts. Raises NotFound for a missing
    or another tenant's session id, SessionEnded (409) if the session is not open; then nothing
    was written. A given `session` object is updated in place (seq, counts, access time). Not
    idempotent by itself (the API's Idempotency-Key makes a retry harmless).
    """
    if not items:
        return []
    if (session is None) == (session_id is None):
        raise TypeError("messages_append takes exactly one of session and session_id")
    counts = [message_token_count(item) for item in items]  # outside the lock: the slow part
    index_fields = message_indexing.message_index_fields(tenant=tenant)
    public_id = session.public_id if session is not None else str(session_id)
    # No savepoint of its own (two round trips inside a caller's transaction): nothing below
    # raises after a write but a database error, which aborts the whole transaction anyway.
    with transaction.atomic(savepoint=False):
        # FOR NO KEY UPDATE, as an UPDATE of the row takes: appenders queue on it, while writes
        # of rows that refer to the session (a build's budget sample, an event) only take
        # FOR KEY SHARE in their foreign-key check and go on. FOR UPDATE blocked those, and a
        # build holding its event stream then waiting on the session deadlocked with an append.
        locked = (
            Session.objects.select_for_update(no_key=True, of=("self",))
            .select_related("agent")
            .filter(tenant=tenant, status=SessionStatus.OPEN)
            .filter(**({"pk": session.pk} if session is not None else {"public_id": session_id}))
            .first()
        )
        messages = [] if locked is None else _append(tenant, locked, items, counts, index_fields)
    if locked is None:
        if session is None:
            session_get(tenant=tenant, session_id=public_id)  # NotFound for a missing or foreign id
        raise SessionEnded(details={"session": public_id})
    if session is not None:
        for name in ("message_seq", "message_count", "token_count", "last_accessed_at", "expires_at"):
            setattr(session, name, getattr(locked, name))
    return messages


def _append(
    tenant: Tenant,
    session: Session,
    items: list[MessageInput],
    counts: list[int],
    index_fields: dict[str, str],
) -> list[Message]:
    """The writes of an append, under the lock of the open `session`."""
    now = timezone.now()
    messages = [
        _message(tenant=tenant, session=session, item=item, seq=session.message_seq + 1 + index,
                 tokens=count, now=now, index_fields=index_fields)
        for index, (item, count) in enumerate(zip(items, counts, strict=True))
    ]  # fmt: skip
    Message.objects.bulk_create(messages)
    _session_advance(session, messages, now)
    recorder.events_append(
        tenant=tenant,
        entries=[(MESSAGE_ADDED, message_event_payload(message)) for message in messages],
        agent=session.agent,
        session=session,
        created_at=now,
    )
    decay.facts_observe_messages(tenant=tenant, session=session, messages=messages)
    if index_fields["embedding_status"] == "pending":
        message_indexing.memory_index_dispatch_on_commit()
    if session.user_id and any(message.role == MessageRole.USER for message in messages):
        # Queued, never run here: no append waits for it (coalesced per session).
        jobs.job_enqueue(
            tenant=tenant,
            kind=jobs.USER_MEMORY_EXTRACT,
            key=f"session:{session.pk}",
            payload={"session": session.pk},
        )
    return messages


def _message(
    *,
    tenant: Tenant,
    session: Session,
    item: MessageInput,
    seq: int,
    tokens: int,
    now: datetime,
    index_fields: dict[str, str],
) -> Message:
    return Message(
        tenant=tenant,
        session=session,
        seq=seq,
        role=item.role,
        content=item.content,
        token_count=tokens,
        turn_id=item.turn_id,
        tool_call_id=item.tool_call_id,
        tool_calls=item.tool_calls,
        event_kind=item.event_kind,
        parent_seq=item.parent_seq,
        artifact_refs=item.artifact_refs,
        metadata=item.metadata,
        name=item.name,
        occurred_at=item.occurred_at or now,
        created_at=now,
        **index_fields,
    )


def _session_advance(session: Session, messages: list[Message], now: datetime) -> None:
    """Move the locked session's counters past `messages`, and its access time (and the idle
    expiry that follows it) when it is more than TOUCH_SECONDS old."""
    session.message_seq += len(messages)
    session.message_count += len(messages)
    session.token_count += sum(message.token_count for message in messages)
    fields = ["message_seq", "message_count", "token_count"]
    if session.last_accessed_at is None or session.last_accessed_at <= now - timedelta(seconds=TOUCH_SECONDS):
        session.last_accessed_at = now
        session.expires_at = now + timedelta(seconds=session.idle_ttl_seconds)
        fields += ["last_accessed_at", "expires_at"]
    session.save(update_fields=fields)
