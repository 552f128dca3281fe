"""Agents, sessions and messages: the write side of every agent turn."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from memory.exceptions import (
    Conflict,
    InvalidInput,
    InvalidTransition,
    NotFound,
    SessionEnded,
    TaskFinished,
)
from memory.models import (
    Agent,
    Message,
    MessageRole,
    Session,
    SessionRetentionPolicy,
    SessionStatus,
    Task,
    TaskStatus,
    Tenant,
    ValueTier,
)
from memory.selectors.sessions import (  # re-exported: the reads callers used to find here
    agent_get,
    messages_after,
    session_get,
    session_latest,
    sessions_list,
    task_get,
    tasks_list,
)
from memory.services import recorder, tokens

__all__ = [
    "agent_get",
    "messages_after",
    "session_get",
    "session_latest",
    "sessions_list",
    "task_get",
    "tasks_list",
]

DEFAULT_SESSION_TTL = timedelta(hours=24)
# A read moves last_accessed_at at most this often (an UPDATE per read would be wasteful).
TOUCH_GRANULARITY = timedelta(seconds=5)
AGENT_ID_MAX_LENGTH = 200


def agent_get_or_create(*, tenant: Tenant, external_id: str) -> Agent:
    """The tenant's agent with this external id, created on first use. Safe under concurrency.

    Raises InvalidInput (field `agent`) for an empty id, one over 200 characters, or one with
    '/' or control characters (agent ids appear in URL paths).
    """
    if (
        not external_id.strip()
        or len(external_id) > AGENT_ID_MAX_LENGTH
        or "/" in external_id
        or not external_id.isprintable()
    ):
        raise InvalidInput(
            f"An agent id is 1 to {AGENT_ID_MAX_LENGTH} printable characters without '/' "
            f"(it appears in URLs: /api/v1/agents/<id>/…); got {external_id[:50]!r}.",
            details={
                "fields": {"agent": [f"Must be 1 to {AGENT_ID_MAX_LENGTH} printable characters, no '/'."]}
            },
        )
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


def session_access(*, tenant: Tenant, session_id: str) -> Session:
    """The session an agent is using, touched: its last_accessed_at/expires_at move to now
    (at most every TOUCH_GRANULARITY), so an agent reading its session keeps it alive.

    The agent-API read. NotFound for a missing id and another tenant's id alike. Operators'
    reads (the dashboard) use memory.selectors.sessions.session_get, which never writes.
    """
    session = session_get(tenant=tenant, session_id=session_id)
    session_touch(session=session)
    return session


def session_touch(*, session: Session, now: datetime | None = None) -> None:
    """Mark an open session as used now (moves its idle expiry). Not an event; idempotent.

    Inside a transaction the UPDATE waits for the commit (on_commit): it would otherwise hold
    the session row's lock until the caller's transaction ends (a context build, say) and
    make every append to the session wait for it.
    """
    now = now or timezone.now()
    if session.status != SessionStatus.OPEN or now - session.last_accessed_at < TOUCH_GRANULARITY:
        return
    expires = now + timedelta(seconds=session.idle_ttl_seconds)
    session.last_accessed_at, session.expires_at = now, expires
    pk = session.pk

    def write() -> None:
        # Never move the clock back (a concurrent append may have touched it later).
        Session.objects.filter(pk=pk, status=SessionStatus.OPEN, last_accessed_at__lt=now).update(
            last_accessed_at=now, expires_at=expires
        )

    if connection.in_atomic_block:
        transaction.on_commit(write)
    else:
        write()


@transaction.atomic
def session_create(
    *,
    tenant: Tenant,
    agent_external_id: str,
    user_id: str = "",
    model_name: str = "",
    metadata: dict[str, Any] | None = None,
    ttl: timedelta | None = None,
    now: datetime | None = None,
) -> Session:
    """Open a session for the agent (created on first use). Records `session.created`.

    `ttl` is the idle TTL (default: the tenant's SessionRetentionPolicy, 24 h). If the agent
    now has more live sessions than the policy allows, the least recently accessed ones are
    evicted in the same transaction (each recording `retention.evicted`). Not idempotent
    (the API's Idempotency-Key makes retries safe).
    """
    policy = SessionRetentionPolicy.for_tenant(tenant)
    if ttl is None:
        ttl = timedelta(hours=policy.session_idle_ttl_hours)
    agent = agent_get_or_create(tenant=tenant, external_id=agent_external_id)
    now = now or timezone.now()
    session = Session.objects.create(
        tenant=tenant,
        agent=agent,
        user_id=user_id,
        model_name=model_name,
        metadata=metadata or {},
        created_at=now,
        last_accessed_at=now,
        idle_ttl_seconds=int(ttl.total_seconds()),
        expires_at=now + ttl,
    )
    recorder.event_append(
        tenant=tenant,
        type="session.created",
        agent=agent,
        session=session,
        payload={"user_id": user_id, "idle_ttl_seconds": session.idle_ttl_seconds},
    )
    from memory.services import retention

    retention.sessions_evict_over_limit(
        tenant=tenant, agent=agent, limit=policy.max_live_sessions_per_agent, now=now
    )
    return session


def session_end(*, tenant: Tenant, session: Session, now: datetime | None = None) -> Session:
    """End an open session: status `ended`, then decay.facts_on_session_end, then `session.ended`;
    its digest update is queued after commit.

    All in one transaction. Ending a session that is no longer open changes nothing and records
    nothing (idempotent); the session is returned as it is.
    """
    now = now or timezone.now()
    with transaction.atomic():
        updated = Session.objects.filter(pk=session.pk, tenant=tenant, status=SessionStatus.OPEN).update(
            status=SessionStatus.ENDED, ended_at=now, last_accessed_at=now, expires_at=None
        )
        session.refresh_from_db()
        if not updated:
            return session
        from memory.services import decay

        decay.facts_on_session_end(tenant=tenant, session=session)
        from memory.services.digest import session_digest_queue

        session_digest_queue(session=session)  # its digest, for the same user's next session
        recorder.event_append(
            tenant=tenant,
            type="session.ended",
            session=session,
            payload={"message_count": session.message_count, "token_count": session.token_count},
        )
    return session


def session_delete(*, tenant: Tenant, session: Session) -> None:
    """Delete a session and its messages (and what other capabilities keep per session).

    Its events stay: they are the audit trail (their `session` link becomes empty, their
    payload keeps `gen_ai.conversation.id`). Its tasks stay, unlinked. Records `session.deleted`.
    """
    with transaction.atomic():
        locked = Session.objects.select_for_update().filter(pk=session.pk, tenant=tenant).first()
        if locked is None:
            raise NotFound.of("session", session.public_id)
        recorder.event_append(
            tenant=tenant,
            type="session.deleted",
            agent=session.agent,
            session=session,
            payload={"status": locked.status, "message_count": locked.message_count},
        )
        locked.delete()


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
    import json

    text = item.content
    if item.tool_calls:
        text += json.dumps(item.tool_calls, separators=(",", ":"), ensure_ascii=False)
    return tokens.count_tokens(text)


def messages_append(*, tenant: Tenant, session: Session, items: list[MessageInput]) -> list[Message]:
    """Append messages to an open session, all or nothing, with gapless consecutive seqs.

    The seq counter lives on the session row and is advanced by one UPDATE that takes the
    row's lock: concurrent appenders queue on it, and a rolled-back append gives its seqs back.
    Records one `message.added` event per message, and lets decay mark referenced facts.
    Raises SessionEnded (409) if the session is not open; then nothing was written.
    Not idempotent by itself (the API's Idempotency-Key makes a retry harmless).
    """
    if not items:
        return []
    counts = [message_token_count(item) for item in items]  # outside the lock: the slow part
    now = timezone.now()
    from memory.services import memory_index

    index_fields = memory_index.message_index_fields(tenant=tenant)
    # savepoint=False: no SAVEPOINT/RELEASE round trips inside the caller's transaction. Safe
    # because nothing here raises after a write except a database error, which aborts the
    # whole PostgreSQL transaction anyway; SessionEnded is raised after the block, unwritten.
    messages: list[Message] = []
    with transaction.atomic(savepoint=False):
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Session._meta.db_table} SET message_seq = message_seq + %s, "
                "message_count = message_count + %s, token_count = token_count + %s, last_accessed_at = %s, "
                "expires_at = %s + make_interval(secs => idle_ttl_seconds) "
                "WHERE id = %s AND status = %s RETURNING message_seq",
                [len(items), len(items), sum(counts), now, now, session.pk, SessionStatus.OPEN],
            )
            row = cursor.fetchone()
        if row is not None:
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
                    name=item.name,
                    occurred_at=item.occurred_at or now,
                    **index_fields,
                )
                for index, (item, count) in enumerate(zip(items, counts, strict=True))
            ]
            Message.objects.bulk_create(messages)
            session.message_seq = first + len(items) - 1
            session.message_count += len(items)
            session.token_count += sum(counts)
            session.last_accessed_at = now
            session.expires_at = now + timedelta(seconds=session.idle_ttl_seconds)
            recorder.event_append_many(
                tenant=tenant,
                type="message.added",
                agent=session.agent,
                session=session,
                payloads=[
                    {"seq": m.seq, "role": m.role, "tokens": m.token_count, "event_kind": m.event_kind}
                    for m in messages
                ],
            )
            from memory.services import decay

            decay.facts_observe_messages(tenant=tenant, session=session, messages=messages)
            if index_fields["embedding_status"] == "pending":
                memory_index.memory_index_dispatch_on_commit()
    if row is None:
        raise SessionEnded(details={"session": session.public_id})
    return messages


# --- message input validation ----------------------------------------------------------------

MESSAGE_FIELDS = frozenset(
    {
        "role",
        "content",
        "turn_id",
        "tool_call_id",
        "tool_calls",
        "event_kind",
        "parent_seq",
        "artifact_refs",
        "metadata",
        "name",
        "occurred_at",
    }
)
ROLES = frozenset(MessageRole.values)
MAX_BIGINT = 2**63 - 1  # PostgreSQL bigint: a larger seq fails in the database, not here
STRING_LIMITS = {"turn_id": 200, "tool_call_id": 200, "event_kind": 64, "name": 200}
# A client-supplied occurred_at may lie at most this far ahead of the server's clock.
OCCURRED_AT_MAX_FUTURE = timedelta(days=1)


def occurred_at_parse(value: Any) -> tuple[datetime | None, str | None]:
    """An ISO 8601 timestamp with a time zone (or None) → (aware datetime, None) or (None, error)."""
    if value is None:
        return None, None
    if not isinstance(value, str):
        return None, "Must be an ISO 8601 date-time string with a time zone, e.g. 2023-05-08T13:56:00Z."
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        return None, f"Not an ISO 8601 date-time: {value[:40]!r}."
    if parsed.tzinfo is None:
        return None, "Must carry a time zone (Z or +hh:mm)."
    if parsed > timezone.now() + OCCURRED_AT_MAX_FUTURE:
        return None, "Must not lie more than a day in the future."
    return parsed, None


def _tool_calls_errors(value: Any) -> list[str]:
    if not isinstance(value, list):
        return ["Must be a list of tool calls: [{id, type: 'function', function: {name, arguments}}]."]
    errors = []
    for index, call in enumerate(value):
        where = f"Item {index}"
        if not isinstance(call, dict):
            errors.append(f"{where} must be an object {{id, type, function}}.")
            continue
        if not isinstance(call.get("id"), str) or not call["id"]:
            errors.append(f"{where}: 'id' must be a non-empty string.")
        if call.get("type") != "function":
            errors.append(f"{where}: 'type' must be 'function'.")
        function = call.get("function")
        if not isinstance(function, dict):
            errors.append(f"{where}: 'function' must be an object {{name, arguments}}.")
            continue
        if not isinstance(function.get("name"), str) or not function["name"]:
            errors.append(f"{where}: 'function.name' must be a non-empty string.")
        if not isinstance(function.get("arguments"), str | dict):
            errors.append(f"{where}: 'function.arguments' must be a JSON string (or an object).")
    return errors


def message_input_parse(data: Any, *, prefix: str = "") -> tuple[MessageInput | None, dict[str, list[str]]]:
    """Check one message as sent to the API; return it, or the errors by field path.

    Pure: no database. `prefix` (`messages[3].`) makes the field names of a batch unambiguous.
    """
    if not isinstance(data, dict):
        return None, {prefix.rstrip(".") or "non_field_errors": ["Must be a message object."]}
    errors: dict[str, list[str]] = {}

    def fail(name: str, message: str) -> None:
        errors.setdefault(prefix + name, []).append(message)

    for name in data.keys() - MESSAGE_FIELDS:
        fail(name, f"Unknown field. Known: {', '.join(sorted(MESSAGE_FIELDS))}.")
    role = data.get("role")
    if not isinstance(role, str) or role not in ROLES:  # a dict or list is unhashable: check type first
        fail("role", f"Must be one of {', '.join(sorted(ROLES))}; got {role!r}.")
        role = None
    content = data.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        fail("content", "Must be a string.")
    else:
        limit = settings.CTXAPP["CTXAPP_MESSAGE_MAX_BYTES"]
        # Cheap bound first: a UTF-8 character is at most 4 bytes.
        if len(content) * 4 > limit and len(content.encode()) > limit:
            fail(
                "content",
                f"Is longer than the limit of {limit} bytes (UTF-8); split it or store it as an artifact.",
            )
    strings = {}
    for name, max_length in STRING_LIMITS.items():
        value = data.get(name)
        if value is None:
            value = ""
        if not isinstance(value, str):
            fail(name, "Must be a string.")
        elif len(value) > max_length:
            fail(name, f"Must be at most {max_length} characters.")
        strings[name] = value
    tool_calls = data.get("tool_calls")
    if tool_calls is None:
        tool_calls = []
    for message in _tool_calls_errors(tool_calls):
        fail("tool_calls", message)
    if tool_calls and role in ROLES and role != MessageRole.ASSISTANT and isinstance(tool_calls, list):
        fail("tool_calls", "Only an assistant message may carry tool calls.")
    if role == MessageRole.TOOL and not strings.get("tool_call_id"):
        fail("tool_call_id", "A tool message must name the tool call it answers (tool_call_id).")
    parent_seq = data.get("parent_seq")
    if parent_seq is not None and (
        isinstance(parent_seq, bool) or not isinstance(parent_seq, int) or not 1 <= parent_seq <= MAX_BIGINT
    ):
        fail("parent_seq", "Must be a positive integer (the seq of an earlier message) or null.")
    artifact_refs = data.get("artifact_refs")
    if artifact_refs is None:
        artifact_refs = []
    if not isinstance(artifact_refs, list):
        fail("artifact_refs", "Must be a list.")
    metadata = data.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        fail("metadata", "Must be an object.")
    occurred_at, occurred_error = occurred_at_parse(data.get("occurred_at"))
    if occurred_error:
        fail("occurred_at", occurred_error)
    if errors:
        return None, errors
    return (
        MessageInput(
            role=str(role),
            content=content,
            turn_id=strings["turn_id"],
            tool_call_id=strings["tool_call_id"],
            tool_calls=tool_calls,
            event_kind=strings["event_kind"],
            parent_seq=parent_seq,
            artifact_refs=artifact_refs,
            metadata=metadata,
            name=strings["name"],
            occurred_at=occurred_at,
        ),
        {},
    )


def message_inputs_parse(data: Any) -> tuple[list[MessageInput], bool]:
    """Parse an append body: one message object, or {"messages": [...]}. Returns (items, is_batch).

    Raises InvalidInput (422) naming every bad field (`messages[3].role` in a batch), so a
    batch with one bad message is refused whole.
    """
    if isinstance(data, dict) and "messages" in data:
        extra = data.keys() - {"messages"}
        if extra:
            raise InvalidInput(
                "A batch body has only the 'messages' key.",
                details={"fields": {name: ["Unknown field in a batch body."] for name in sorted(extra)}},
            )
        raw = data["messages"]
        limit = settings.CTXAPP["CTXAPP_BATCH_MAX_MESSAGES"]
        if not isinstance(raw, list) or not raw:
            raise InvalidInput(
                "'messages' must be a non-empty list of messages.",
                details={"fields": {"messages": ["Must be a non-empty list."]}},
            )
        if len(raw) > limit:
            raise InvalidInput(
                f"A batch holds at most {limit} messages; got {len(raw)}. Split it.",
                details={"fields": {"messages": [f"At most {limit} messages per batch."]}, "limit": limit},
            )
        items: list[MessageInput] = []
        errors: dict[str, list[str]] = {}
        for index, entry in enumerate(raw):
            item, item_errors = message_input_parse(entry, prefix=f"messages[{index}].")
            errors.update(item_errors)
            if item is not None:
                items.append(item)
        if errors:
            first = next(iter(errors))
            raise InvalidInput(f"{first}: {errors[first][0]}", details={"fields": errors})
        return items, True
    item, errors = message_input_parse(data)
    if errors:
        first = next(iter(errors))
        raise InvalidInput(f"{first}: {errors[first][0]}", details={"fields": errors})
    assert item is not None
    return [item], False


# --- tasks -----------------------------------------------------------------------------------


def task_create(
    *,
    tenant: Tenant,
    session: Session | None = None,
    agent_external_id: str | None = None,
    user_id: str = "",
    title: str = "",
    input: str = "",
    value_tier: str = ValueTier.NORMAL,
    metadata: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Task:
    """Record a new task (status pending), expiring after the tenant's task retention.

    The agent is the session's when a session is given (a different `agent_external_id`
    → Conflict). Records `task.created` on the agent's stream (the tenant stream without one).
    """
    now = now or timezone.now()
    policy = SessionRetentionPolicy.for_tenant(tenant)
    with transaction.atomic():
        agent = None
        if session is not None:
            agent = session.agent
            if agent_external_id is not None and agent_external_id != agent.external_id:
                raise Conflict(
                    f"Session {session.public_id} belongs to agent {agent.external_id!r}, "
                    f"not {agent_external_id!r}.",
                    details={"fields": {"agent": ["Does not match the session's agent."]}},
                )
            user_id = user_id or session.user_id
        elif agent_external_id:
            agent = agent_get_or_create(tenant=tenant, external_id=agent_external_id)
        task = Task.objects.create(
            tenant=tenant,
            session=session,
            agent=agent,
            user_id=user_id,
            title=title,
            input=input,
            value_tier=value_tier,
            metadata=metadata or {},
            created_at=now,
            updated_at=now,
            expires_at=now + timedelta(days=policy.task_retention_days),
        )
        recorder.event_append(
            tenant=tenant,
            type="task.created",
            agent=agent,
            session=session,
            payload={"task": task.public_id, "title": title, "value_tier": value_tier, "user_id": user_id},
        )
    return task


ALLOWED_TRANSITIONS = {
    TaskStatus.PENDING: {TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED},
    TaskStatus.RUNNING: {TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED},
}


def task_update(
    *,
    tenant: Tenant,
    task: Task,
    status: str | None = None,
    output: str | None = None,
    metadata: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Task:
    """Change a task's status, output or metadata (metadata is merged key by key).

    pending → running → succeeded | failed; a finished task is final (TaskFinished, 409);
    running → pending is refused (InvalidTransition, 409). When the task becomes succeeded or
    failed, distillation.task_finished runs inside this transaction and `task.completed` is
    recorded; any other change records `task.updated`.
    """
    now = now or timezone.now()
    with transaction.atomic():
        locked = (
            Task.objects.select_for_update(of=("self",))
            .select_related("session", "agent")
            .get(pk=task.pk, tenant=tenant)
        )
        if locked.status in TaskStatus.finished():
            raise TaskFinished(details={"task": locked.public_id, "status": locked.status})
        if status is not None and status not in ALLOWED_TRANSITIONS[TaskStatus(locked.status)]:
            raise InvalidTransition(
                f"A {locked.status} task cannot become {status}.",
                details={"fields": {"status": [f"Not allowed from {locked.status}."]}},
            )
        changed: list[str] = []
        if output is not None and output != locked.output:
            locked.output = output
            changed.append("output")
        if metadata:
            locked.metadata = {**locked.metadata, **metadata}
            changed.append("metadata")
        finishing = status is not None and status in TaskStatus.finished()
        if status is not None and status != locked.status:
            locked.status = status
            changed.append("status")
        if finishing:
            locked.finished_at = now
            changed.append("finished_at")
        if not changed:
            return locked
        locked.updated_at = now
        locked.save(update_fields=[*changed, "updated_at"])
        payload = {
            "task": locked.public_id,
            "status": locked.status,
            "changed": [c for c in changed if c != "finished_at"],
        }
        if finishing:
            from memory.services import distillation

            distillation.task_finished(tenant=tenant, task=locked)
            recorder.event_append(
                tenant=tenant,
                type="task.completed",
                agent=locked.agent,
                session=locked.session,
                payload=payload,
            )
        else:
            recorder.event_append(
                tenant=tenant,
                type="task.updated",
                agent=locked.agent,
                session=locked.session,
                payload=payload,
            )
    return locked
