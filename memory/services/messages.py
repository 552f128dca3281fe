"""Appending messages to a session: the hot path of every agent turn, in one statement.

`messages_append` reads the session, reserves its seqs, inserts the messages and their
`message.added` events and advances decay's round counter in ONE statement (a CTE), inside the
caller's transaction. Before, the same work took six round trips (session read, seq reservation,
message insert, event insert, round counter, and the API's idempotency record on top); on a busy
PostgreSQL every round trip costs milliseconds (docs/benchmarks.md, bench_peers.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ctxapp.infra import broadcast
from ctxapp.infra.prepared import prepared_cursor
from memory.exceptions import SessionEnded
from memory.models import (
    Agent,
    Event,
    EventStream,
    FactRoundCounter,
    Message,
    MessageRole,
    Session,
    SessionStatus,
    Tenant,
    TrackedFact,
)
from memory.selectors.sessions import session_get
from memory.services import decay, message_indexing, recorder, tokens

MESSAGE_ADDED = "message.added"
TOUCH_SECONDS = 1  # how stale a session's last_accessed_at may get while it is being appended to


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


_SESSION_COLUMNS = [f.column for f in Session._meta.concrete_fields]
_AGENT_COLUMNS = [f.column for f in Agent._meta.concrete_fields]

# The statement. `s` reserves the seqs: its UPDATE takes the session row's lock, so concurrent
# appenders queue on it and seqs are gapless (a rolled-back append gives them back); an ended,
# missing or foreign session matches no row, and then every other part inserts nothing. The
# event stream's counter is taken after the session row (each part reads `s`), the order every
# other append takes them in. `r` advances decay's round counter when the batch has user
# messages; the last two columns are the session's round and whether it tracks any fact.
# The access time (and the idle expiry from it) moves only when it is more than a second old: a
# session appended to several times a second then changes no indexed column, so PostgreSQL
# updates its row in place (HOT) instead of writing a new entry in each of its indexes.
_APPEND_SQL = """
WITH s AS (
    UPDATE {session} AS s SET message_seq = s.message_seq + %(n)s, message_count = s.message_count + %(n)s,
        token_count = s.token_count + %(tokens)s,
        last_accessed_at = CASE WHEN {touch} THEN %(now)s ELSE s.last_accessed_at END,
        expires_at = CASE WHEN {touch} THEN %(now)s + make_interval(secs => s.idle_ttl_seconds)
            ELSE s.expires_at END
    FROM {agent} AS a
    WHERE s.tenant_id = %(tenant)s AND {match} AND s.status = %(open)s AND a.id = s.agent_id
    RETURNING {returning}, s.message_seq - %(n)s AS first_seq, 'agent:' || a.external_id AS stream
),
u AS (
    SELECT * FROM ROWS FROM (jsonb_to_recordset(%(items)s::jsonb) AS (role varchar, content text,
        token_count int, turn_id varchar, tool_call_id varchar, tool_calls jsonb, event_kind varchar,
        parent_seq bigint, artifact_refs jsonb, metadata jsonb, name varchar, occurred_at timestamptz,
        event_id varchar)) WITH ORDINALITY AS u(role, content, token_count, turn_id, tool_call_id,
            tool_calls, event_kind, parent_seq, artifact_refs, metadata, name, occurred_at, event_id, ord)
),
m AS (
    INSERT INTO {message} (tenant_id, session_id, seq, role, content, token_count, turn_id,
        tool_call_id, tool_calls, event_kind, parent_seq, artifact_refs, metadata, created_at, name,
        occurred_at, search_config, embedding_status, embedding_model, embedding_attempts,
        embedding_error)
    SELECT %(tenant)s, s.id, s.first_seq + u.ord, u.role, u.content, u.token_count, u.turn_id,
        u.tool_call_id, u.tool_calls, u.event_kind, u.parent_seq, u.artifact_refs, u.metadata,
        %(now)s, u.name, u.occurred_at, %(search_config)s::regconfig, %(embedding_status)s, '', 0, ''
    FROM s, u
    RETURNING id, seq
),
st AS (
    INSERT INTO {stream} AS t (tenant_id, key, last_seq) SELECT %(tenant)s, s.stream, %(n)s FROM s
    ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = t.last_seq + EXCLUDED.last_seq
    RETURNING last_seq - %(n)s AS first_seq
),
e AS (
    INSERT INTO {event} (tenant_id, public_id, stream, seq, type, agent_id, session_id, payload, created_at)
    SELECT %(tenant)s, u.event_id, s.stream, st.first_seq + u.ord, %(type)s, s.agent_id, s.id,
        jsonb_build_object('gen_ai.conversation.id', s.public_id, 'gen_ai.agent.id', s.a_external_id,
            'seq', s.first_seq + u.ord, 'role', u.role, 'tokens', u.token_count,
            'event_kind', u.event_kind)
        || CASE WHEN s.model_name <> '' THEN jsonb_build_object('gen_ai.request.model', s.model_name)
           ELSE '{{}}'::jsonb END,
        %(now)s
    FROM s, st, u
    RETURNING id, seq
),
r AS (
    UPDATE {rounds} AS c SET rounds = c.rounds + %(user_n)s, last_user_seq = s.first_seq + %(last_user)s
    FROM s WHERE c.session_id = s.id AND %(user_n)s > 0
    RETURNING c.rounds
)
SELECT s.*, (SELECT array_agg(id ORDER BY seq) FROM m), (SELECT array_agg(id ORDER BY seq) FROM e),
    (SELECT min(seq) FROM e),
    COALESCE((SELECT rounds FROM r), (SELECT rounds FROM {rounds} WHERE session_id = s.id)),
    EXISTS (SELECT 1 FROM {facts} WHERE session_id = s.id), {listeners}
FROM s
"""


@functools.cache
def _append_sql(match: str, listeners: str = "true") -> str:
    returning = ", ".join(
        [f"s.{column}" for column in _SESSION_COLUMNS]
        + [f"a.{column} AS a_{column}" for column in _AGENT_COLUMNS]
    )
    return _APPEND_SQL.format(
        session=Session._meta.db_table,
        agent=Agent._meta.db_table,
        message=Message._meta.db_table,
        stream=EventStream._meta.db_table,
        event=Event._meta.db_table,
        rounds=FactRoundCounter._meta.db_table,
        facts=TrackedFact._meta.db_table,
        match=match,
        listeners=listeners,
        returning=returning,
        touch=f"s.last_accessed_at <= %(now)s - interval '{TOUCH_SECONDS} second'",
    )


_BY_PK = "s.id = %(session)s"
_BY_PUBLIC_ID = "s.public_id = %(session)s"


_new_event_id = Event._meta.get_field("public_id").get_default


def _rows_json(
    items: list[MessageInput], counts: list[int], occurred: list[datetime], event_ids: list[str]
) -> str:
    """The rows as one JSON parameter (jsonb_to_recordset): one json.dumps in C instead of
    thirteen arrays adapted element by element in Python (a third of a 100-message batch's
    CPU, docs/benchmarks.md, bench_peers.py)."""
    rows = [
        {
            "role": item.role,
            "content": item.content,
            "token_count": count,
            "turn_id": item.turn_id,
            "tool_call_id": item.tool_call_id,
            "tool_calls": item.tool_calls,
            "event_kind": item.event_kind,
            "parent_seq": item.parent_seq,
            "artifact_refs": item.artifact_refs,
            "metadata": item.metadata,
            "name": item.name,
            "occurred_at": at.isoformat(),
            "event_id": event_id,
        }
        for item, count, at, event_id in zip(items, counts, occurred, event_ids, strict=True)
    ]
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


def _params(*, tenant: Tenant, items: list[MessageInput], counts: list[int], now: datetime) -> dict[str, Any]:
    user_ords = [index + 1 for index, item in enumerate(items) if item.role == MessageRole.USER]
    index_fields = message_indexing.message_index_fields(tenant=tenant)
    occurred = [item.occurred_at or now for item in items]
    event_ids = [_new_event_id() for _ in items]
    return {
        "tenant": tenant.pk,
        "n": len(items),
        "tokens": sum(counts),
        "now": now,
        "open": SessionStatus.OPEN,
        "type": MESSAGE_ADDED,
        "user_n": len(user_ords),
        "last_user": user_ords[-1] if user_ords else 0,
        "search_config": index_fields["search_config"],
        "embedding_status": index_fields["embedding_status"],
        "occurred_at": occurred,
        "event_id": event_ids,
        "items": _rows_json(items, counts, occurred, event_ids),
    }


@dataclass
class _Appended:
    session: Session
    message_ids: list[int]
    event_ids: list[int]
    first_event_seq: int
    rounds: int | None
    has_facts: bool
    listened: bool  # a dashboard of the tenant listens (or the channel layer cannot tell)


def _appended(row: tuple[Any, ...]) -> _Appended:
    sessions, agents = len(_SESSION_COLUMNS), len(_AGENT_COLUMNS)
    session = Session.from_db(
        connection.alias, [f.attname for f in Session._meta.concrete_fields], row[:sessions]
    )
    session.agent = Agent.from_db(
        connection.alias, [f.attname for f in Agent._meta.concrete_fields], row[sessions : sessions + agents]
    )
    message_ids, event_ids, first_event_seq, rounds, has_facts, listened = row[sessions + agents + 2 :]
    return _Appended(
        session,
        list(message_ids),
        list(event_ids),
        int(first_event_seq),
        rounds,
        bool(has_facts),
        bool(listened),
    )


def messages_append(
    *,
    tenant: Tenant,
    items: list[MessageInput],
    session: Session | None = None,
    session_id: str | None = None,
) -> list[Message]:
    """Append messages to an open session, all or nothing, with gapless consecutive seqs.

    The session is given as an object or by its public id (`session_id`: then it is read in the
    same statement, scoped to the tenant). The seq counter lives on the session row and is
    advanced by an UPDATE that takes the row's lock: concurrent appenders queue on it, and a
    rolled-back append gives its seqs back. Records one `message.added` event per message in the
    same statement and transaction (broadcast after commit), and lets decay mark referenced
    facts. Raises NotFound for a missing or another tenant's session id, SessionEnded (409) if
    the session is not open; then nothing was written. A given `session` object is updated in
    place (seq, counts, access time). Not idempotent by itself (the API's Idempotency-Key makes a
    retry harmless).
    """
    if not items:
        return []
    if (session is None) == (session_id is None):
        raise TypeError("messages_append takes exactly one of session and session_id")
    counts = [message_token_count(item) for item in items]  # outside the lock: the slow part
    now = timezone.now()
    params = _params(tenant=tenant, items=items, counts=counts, now=now)
    public_id = session.public_id if session is not None else str(session_id)
    params["session"] = session.pk if session is not None else session_id
    match = _BY_PK if session is not None else _BY_PUBLIC_ID
    # With no dashboard open, a live update's whole cost was its own round trip after the commit
    # (a quarter of an in-process append): the statement asks whether a page listens.
    listeners = broadcast.listeners_sql(tenant.pk, "%(channel_group_key)s")
    if listeners is None:  # the channel layer cannot be asked in SQL: always send
        statement = _append_sql(match)
    else:
        statement = _append_sql(match, listeners[0])
        params["channel_group_key"] = listeners[1]
    # savepoint=False: no SAVEPOINT/RELEASE round trips inside the caller's transaction. Safe
    # because nothing here raises after a write except a database error, which aborts the
    # whole PostgreSQL transaction anyway; SessionEnded is raised after the block, unwritten.
    messages: list[Message] = []
    with transaction.atomic(savepoint=False):
        with prepared_cursor() as cursor:
            cursor.execute(statement, params)
            row = cursor.fetchone()
        if row is not None:
            appended = _appended(row)
            current = _session_refreshed(session, appended.session)
            messages = _messages(tenant, current, items, counts, params, appended)
            if appended.listened:
                _events_broadcast(tenant, current, messages, params, appended)
            decay.facts_observe_messages(
                tenant=tenant,
                session=current,
                messages=messages,
                progress=(appended.rounds, appended.has_facts),
            )
            if params["embedding_status"] == "pending":
                message_indexing.memory_index_dispatch_on_commit()
    if row is None:
        if session is None:
            session_get(tenant=tenant, session_id=public_id)  # NotFound for a missing or foreign id
        raise SessionEnded(details={"session": public_id})
    return messages


def _session_refreshed(given: Session | None, stored: Session) -> Session:
    """The caller's session object brought up to date with the row as written, or the row."""
    if given is None:
        return stored
    for name in ("message_seq", "message_count", "token_count", "last_accessed_at", "expires_at"):
        setattr(given, name, getattr(stored, name))
    return given


_MESSAGE_FIELDS = [
    "id", "tenant_id", "session_id", "seq", "role", "content", "token_count", "turn_id", "tool_call_id",
    "tool_calls", "event_kind", "parent_seq", "artifact_refs", "metadata", "created_at", "name",
    "occurred_at", "search_config", "embedding_status", "embedding_model", "embedding_attempts",
    "embedding_error",
]  # fmt: skip


def _messages(
    tenant: Tenant,
    session: Session,
    items: list[MessageInput],
    counts: list[int],
    params: dict[str, Any],
    appended: _Appended,
) -> list[Message]:
    """The appended rows as Message objects, as a read would load them (from_db: a batch of 1,000
    costs a fraction of building them field by field). The search vector and the embedding are
    not loaded."""
    first = session.message_seq - len(items) + 1
    now, occurred, config, status = (
        params["now"], params["occurred_at"], params["search_config"], params["embedding_status"]
    )  # fmt: skip
    messages = []
    for index, (item, count, pk) in enumerate(zip(items, counts, appended.message_ids, strict=True)):
        message = Message.from_db(
            connection.alias,
            _MESSAGE_FIELDS,
            [
                pk, tenant.pk, session.pk, first + index, item.role, item.content, count, item.turn_id,
                item.tool_call_id, item.tool_calls, item.event_kind, item.parent_seq, item.artifact_refs,
                item.metadata, now, item.name, occurred[index], config, status, "", 0, "",
            ],
        )  # fmt: skip
        message.session = session
        messages.append(message)
    return messages


def _events_broadcast(
    tenant: Tenant, session: Session, messages: list[Message], params: dict[str, Any], appended: _Appended
) -> None:
    """Hand the recorded events to the tenant's dashboards after commit, in the small form
    recorder.event_summary gives every event."""
    stream = recorder.stream_key(session.agent)
    created = params["now"].isoformat()
    for offset in range(len(messages)):
        broadcast.on_commit(
            tenant.pk,
            {
                "id": params["event_id"][offset],
                "stream": stream,
                "seq": appended.first_event_seq + offset,
                "type": MESSAGE_ADDED,
                "session": session.public_id,
                "agent": session.agent.external_id,
                "created_at": created,
            },
        )
