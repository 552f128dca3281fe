"""Appending messages to a session: the hot path of every agent turn, in one statement.

`messages_append` reads the session, reserves its seqs, inserts the messages and their
`message.added` events and advances decay's round counter in ONE statement (a CTE), inside the
caller's transaction. Before, the same work took six round trips (session read, seq reservation,
message insert, event insert, round counter, and the API's idempotency record on top); on a busy
PostgreSQL every round trip costs milliseconds (docs/benchmarks.md, bench_peers.py). The events'
part of the statement is the recorder's (`recorder.StatementEvents`), and so are the events handed
to the dashboards; the message row's columns come from the model.
"""

from __future__ import annotations

import functools
import json
import operator
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from ctxapp.infra.prepared import prepared_cursor
from memory.exceptions import SessionEnded
from memory.models import (
    Agent,
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
from memory.services import decay, jobs, message_indexing, recorder, tokens

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

# What a message's `message.added` event says of it besides the OTel ids: payload key → field.
MESSAGE_EVENT_PAYLOAD = {"seq": "seq", "role": "role", "tokens": "token_count", "event_kind": "event_kind"}


def message_event_payload(message: Message) -> dict[str, Any]:
    """The own payload of a message's `message.added` event (recorder.events_build adds the OTel ids)."""
    return {key: getattr(message, name) for key, name in MESSAGE_EVENT_PAYLOAD.items()}


# The message row, from the model: the fields a batch's rows carry (`u`, of the table's base
# types), those the statement computes, and the rest stored as their defaults; a field whose
# default is NULL (the embedding, which comes later) is left to the column, and the generated
# search vector is neither inserted nor loaded.
_ITEM_FIELDS = ("role", "content", "token_count", "turn_id", "tool_call_id", "tool_calls", "event_kind",
                "parent_seq", "artifact_refs", "metadata", "name", "occurred_at")  # fmt: skip
_INPUT_FIELDS = tuple(name for name in _ITEM_FIELDS if name not in ("token_count", "occurred_at"))
_STATEMENT_VALUES = {"tenant_id": "%(tenant)s", "session_id": "s.id", "seq": "s.first_seq + u.ord",
                     "created_at": "%(now)s", "search_config": "%(search_config)s::regconfig",
                     "embedding_status": "%(embedding_status)s"}  # fmt: skip
_FIELDS = {f.name: f for f in Message._meta.concrete_fields}
_STORED = [f for f in Message._meta.concrete_fields if not f.primary_key and not f.generated]
_DEFAULTED = [f for f in _STORED if f.attname not in _STATEMENT_VALUES and f.name not in _ITEM_FIELDS]
_DEFAULTS = {f"default_{f.attname}": f.get_default() for f in _DEFAULTED}
_INSERTED = [f for f in _STORED if f not in _DEFAULTED or f.get_default() is not None]
_LOADED = [Message._meta.pk.attname, *(f.attname for f in _STORED)]
_read_input = operator.attrgetter(*_INPUT_FIELDS)
# A loaded row is put together as (input fields, then _COMPUTED) and reordered by the model's
# field order in C: a batch of 1,000 builds no dict per message.
_COMPUTED = ("id", "seq", "token_count", "occurred_at", "tenant_id", "session_id", "created_at",
             "search_config", "embedding_status", *(f.attname for f in _DEFAULTED))  # fmt: skip
_in_model_order = operator.itemgetter(*(list(_INPUT_FIELDS + _COMPUTED).index(name) for name in _LOADED))
# What `m` returns besides the id: the seq (the events' order) and what their payload reads.
_RETURNED = [_FIELDS[name] for name in ("seq", *MESSAGE_EVENT_PAYLOAD.values())]

# The `message.added` events, made by the recorder from the inserted messages (`m`).
_EVENTS = recorder.StatementEvents(
    type=MESSAGE_ADDED,
    rows="s, st, m",
    ordinal="(m.seq - s.first_seq)",
    stream="s.stream",
    stream_seq="st.first_seq",
    columns={"session": "s.{}", "agent": "s.a_{}"},
    payload={key: f"m.{_FIELDS[name].column}" for key, name in MESSAGE_EVENT_PAYLOAD.items()},
)

# The statement. `s` reserves the seqs: its UPDATE takes the session row's lock, so concurrent
# appenders queue on it and seqs are gapless (a rolled-back append gives them back); an ended,
# missing or foreign session matches no row, and then every other part inserts nothing. The
# event stream's counter is taken after the session row (each part reads `s`), the order every
# other append takes them in; `e` is the recorder's. `r` advances decay's round counter when the
# batch has user messages; the last two columns are the session's round and whether it tracks
# any fact. The access time (and the idle expiry from it) moves only when it is more than a
# second old: a session appended to several times a second then changes no indexed column, so
# PostgreSQL updates its row in place (HOT) instead of writing a new entry in each of its indexes.
# `x` queues extraction of user memories (memory/services/user_memory/extraction.py) when the batch
# has a user turn and the session a user: the outbox intent of `jobs.job_enqueue`, made by this
# statement so that it costs the append no round trip; coalesced per session like any intent.
_EXTRACT_SQL = jobs.job_intent_insert_sql(
    "SELECT %(tenant)s, %(extract_kind)s, 'session:' || s.id, jsonb_build_object('session', s.id), "
    "'pending', 0, '', now(), now() FROM s WHERE %(user_n)s > 0 AND s.user_id <> ''"
)

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
    SELECT * FROM ROWS FROM (jsonb_to_recordset(%(items)s::jsonb) AS ({item_types}))
        WITH ORDINALITY AS u({item_columns}, ord)
),
m AS (
    INSERT INTO {message} ({message_columns}) SELECT {message_values} FROM s, u
    RETURNING id, {payload_columns}
),
st AS (
    INSERT INTO {stream} AS t (tenant_id, key, last_seq) SELECT %(tenant)s, s.stream, %(n)s FROM s
    ON CONFLICT (tenant_id, key) DO UPDATE SET last_seq = t.last_seq + EXCLUDED.last_seq
    RETURNING last_seq - %(n)s AS first_seq
),
e AS ({events}),
r AS (
    UPDATE {rounds} AS c SET rounds = c.rounds + %(user_n)s, last_user_seq = s.first_seq + %(last_user)s
    FROM s WHERE c.session_id = s.id AND %(user_n)s > 0
    RETURNING c.rounds
),
x AS ({extract})
SELECT s.*, (SELECT id FROM x),
    (SELECT array_agg(id ORDER BY seq) FROM m), (SELECT array_agg(id ORDER BY seq) FROM e),
    (SELECT min(seq) FROM e),
    COALESCE((SELECT rounds FROM r), (SELECT rounds FROM {rounds} WHERE session_id = s.id)),
    EXISTS (SELECT 1 FROM {facts} WHERE session_id = s.id), {listeners}
FROM s
"""


def _message_value(field: Any) -> str:
    if field.attname in _STATEMENT_VALUES:
        return _STATEMENT_VALUES[field.attname]
    if field.name in _ITEM_FIELDS:
        return f"u.{field.column}"
    return f"%(default_{field.attname})s"


def _base_type(field: Any) -> str:
    """The column's type without its length (`varchar`): a value too long fails at the INSERT."""
    return re.sub(r"\(\d+\)$", "", field.db_type(connection))


@functools.cache
def _append_sql(match: str, listeners: str) -> str:
    returning = ", ".join(
        [f"s.{column}" for column in _SESSION_COLUMNS]
        + [f"a.{column} AS a_{column}" for column in _AGENT_COLUMNS]
    )
    items = [_FIELDS[name] for name in _ITEM_FIELDS]
    return _APPEND_SQL.format(
        session=Session._meta.db_table,
        agent=Agent._meta.db_table,
        message=Message._meta.db_table,
        stream=EventStream._meta.db_table,
        rounds=FactRoundCounter._meta.db_table,
        facts=TrackedFact._meta.db_table,
        item_types=", ".join(f"{f.column} {_base_type(f)}" for f in items),
        item_columns=", ".join(str(f.column) for f in items),
        message_columns=", ".join(str(f.column) for f in _INSERTED),
        message_values=", ".join(_message_value(f) for f in _INSERTED),
        payload_columns=", ".join(dict.fromkeys(str(f.column) for f in _RETURNED)),
        events=_EVENTS.insert_sql,
        extract=_EXTRACT_SQL,
        match=match,
        listeners=listeners,
        returning=returning,
        touch=f"s.last_accessed_at <= %(now)s - interval '{TOUCH_SECONDS} second'",
    )


_BY_PK = "s.id = %(session)s"
_BY_PUBLIC_ID = "s.public_id = %(session)s"


def _rows_json(items: list[MessageInput], counts: list[int], occurred: list[datetime]) -> str:
    """The rows as one JSON parameter (jsonb_to_recordset): one json.dumps in C instead of
    thirteen arrays adapted element by element in Python (a third of a 100-message batch's
    CPU, docs/benchmarks.md, bench_peers.py)."""
    rows = []
    for item, count, at in zip(items, counts, occurred, strict=True):
        row = dict(zip(_INPUT_FIELDS, _read_input(item), strict=True))
        row["token_count"], row["occurred_at"] = count, at.isoformat()
        rows.append(row)
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"))


def _params(*, tenant: Tenant, items: list[MessageInput], counts: list[int], now: datetime) -> dict[str, Any]:
    user_ords = [index + 1 for index, item in enumerate(items) if item.role == MessageRole.USER]
    index_fields = message_indexing.message_index_fields(tenant=tenant)
    occurred = [item.occurred_at or now for item in items]
    return {
        "tenant": tenant.pk,
        "n": len(items),
        "tokens": sum(counts),
        "now": now,
        "open": SessionStatus.OPEN,
        "user_n": len(user_ords),
        "last_user": user_ords[-1] if user_ords else 0,
        "search_config": index_fields["search_config"],
        "embedding_status": index_fields["embedding_status"],
        "occurred_at": occurred,
        "items": _rows_json(items, counts, occurred),
        "extract_kind": jobs.USER_MEMORY_EXTRACT,
        **_DEFAULTS,
        **_EVENTS.params(tenant=tenant, count=len(items), now=now),
    }


@dataclass
class _Appended:
    extract_intent: int | None  # the extraction job this append queued (None: coalesced, or none due)
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
    extract_id, message_ids, event_ids, first_event_seq, rounds, has_facts, listened = row[
        sessions + agents + 2 :
    ]
    return _Appended(
        extract_id,
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
    listening, listening_params = _EVENTS.listening(tenant)
    statement = _append_sql(match, listening)
    params.update(listening_params)
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
            if appended.extract_intent is not None:  # queued, never run here: no append waits for it
                jobs.job_dispatch_on_commit(appended.extract_intent, background=True)
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


def _messages(
    tenant: Tenant,
    session: Session,
    items: list[MessageInput],
    counts: list[int],
    params: dict[str, Any],
    appended: _Appended,
) -> list[Message]:
    """The appended rows as Message objects, as a read would load them (from_db: a batch of 1,000
    costs a fraction of building them field by field). The search vector is not loaded."""
    first = session.message_seq - len(items) + 1
    occurred = params["occurred_at"]
    common = (
        tenant.pk, session.pk, params["now"], params["search_config"], params["embedding_status"],
        *(params[f"default_{f.attname}"] for f in _DEFAULTED),
    )  # fmt: skip
    messages = []
    for index, (item, count, pk) in enumerate(zip(items, counts, appended.message_ids, strict=True)):
        row = (*_read_input(item), pk, first + index, count, occurred[index], *common)
        message = Message.from_db(connection.alias, _LOADED, _in_model_order(row))
        message.session = session
        messages.append(message)
    return messages


def _events_broadcast(
    tenant: Tenant, session: Session, messages: list[Message], params: dict[str, Any], appended: _Appended
) -> None:
    """Hand the recorded events to the tenant's dashboards after commit, as the recorder gives
    every event."""
    seqs = range(appended.first_event_seq, appended.first_event_seq + len(messages))
    _EVENTS.broadcast(
        tenant=tenant,
        agent=session.agent,
        session=session,
        payloads=[message_event_payload(message) for message in messages],
        params=params,
        rows=zip(params["event_public_ids"], appended.event_ids, seqs, strict=True),
    )
