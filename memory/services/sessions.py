"""Agents, sessions and messages: the write side of every agent turn."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict, Unpack

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from memory.exceptions import (
    Conflict,
    InvalidInput,
    InvalidTransition,
    NotFound,
    TaskFinished,
)
from memory.models import (
    Agent,
    Session,
    SessionRetentionPolicy,
    SessionStatus,
    Task,
    TaskStatus,
    Tenant,
    ValueTier,
)

# The reads callers used to find here, re-exported; they live in memory.selectors (pure reads).
from memory.selectors.sessions import agent_get as agent_get
from memory.selectors.sessions import messages_after as messages_after
from memory.selectors.sessions import session_get as session_get
from memory.selectors.sessions import session_latest as session_latest
from memory.selectors.sessions import sessions_list as sessions_list
from memory.selectors.sessions import task_get as task_get
from memory.selectors.sessions import tasks_list as tasks_list
from memory.services import decay, distillation, recorder, retention

# Appending messages lives in memory.services.messages (one statement); re-exported for callers.
from memory.services.messages import MessageInput as MessageInput
from memory.services.messages import message_token_count as message_token_count
from memory.services.messages import messages_append as messages_append
from memory.services.session_digest import session_digest_queue
from memory.services.session_erasure import session_erase

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


class SessionFields(TypedDict, total=False):
    """What a new session may be given besides its tenant and agent (see session_open)."""

    user_id: str
    model_name: str
    metadata: dict[str, Any] | None
    ttl: timedelta | None
    key: str | None
    now: datetime | None


def session_create(*, tenant: Tenant, agent_external_id: str, **fields: Unpack[SessionFields]) -> Session:
    """Open a session for the agent (see session_open); the session only."""
    session, _ = session_open(tenant=tenant, agent_external_id=agent_external_id, **fields)
    return session


@transaction.atomic
def session_open(
    *,
    tenant: Tenant,
    agent_external_id: str,
    user_id: str = "",
    model_name: str = "",
    metadata: dict[str, Any] | None = None,
    ttl: timedelta | None = None,
    key: str | None = None,
    now: datetime | None = None,
) -> tuple[Session, bool]:
    """Open a session for the agent (created on first use). Records `session.created`.

    Returns (session, created). With a `key` (the application's own id of the conversation,
    unique per agent) the agent's session with that key is returned unchanged when it exists,
    whatever its status (created False): a repeat is idempotent, also when two run at once.
    Without one, every call opens a new session (the API's Idempotency-Key makes retries safe).

    `ttl` is the idle TTL (default: the tenant's SessionRetentionPolicy, 24 h). If the agent
    now has more live sessions than the policy allows, the least recently accessed ones are
    evicted in the same transaction (each recording `retention.evicted`).
    """
    policy = SessionRetentionPolicy.for_tenant(tenant)
    if ttl is None:
        ttl = timedelta(hours=policy.session_idle_ttl_hours)
    agent = agent_get_or_create(tenant=tenant, external_id=agent_external_id)
    if key is not None:
        existing = _session_with_key(tenant=tenant, agent=agent, key=key)
        if existing is not None:
            return existing, False
    now = now or timezone.now()
    fields = {
        "tenant": tenant,
        "agent": agent,
        "key": key,
        "user_id": user_id,
        "model_name": model_name,
        "metadata": metadata or {},
        "created_at": now,
        "last_accessed_at": now,
        "idle_ttl_seconds": int(ttl.total_seconds()),
        "expires_at": now + ttl,
    }
    try:
        with transaction.atomic():  # a savepoint: a concurrent create of the same key wins
            session = Session.objects.create(**fields)
    except IntegrityError:
        existing = _session_with_key(tenant=tenant, agent=agent, key=key) if key is not None else None
        if existing is None:
            raise
        return existing, False
    recorder.event_append(
        tenant=tenant,
        type="session.created",
        agent=agent,
        session=session,
        payload={"user_id": user_id, "idle_ttl_seconds": session.idle_ttl_seconds},
    )
    retention.sessions_evict_over_limit(
        tenant=tenant, agent=agent, limit=policy.max_live_sessions_per_agent, now=now
    )
    return session, True


def _session_with_key(*, tenant: Tenant, agent: Agent, key: str) -> Session | None:
    return Session.objects.select_related("agent").filter(tenant=tenant, agent=agent, key=key).first()


def session_end(*, tenant: Tenant, session: Session, now: datetime | None = None) -> Session:
    """End an open session: status `ended`, then decay.facts_on_session_end, then `session.ended`;
    its digest update is queued after commit.

    All in one transaction. Ending a session that is no longer open changes nothing and records
    nothing (idempotent); the session is returned as it is.

    Locks in one order: the session row (as an append takes it), then the agent's stream counter,
    then the experiences its facts promote to (in the order of their keys). Two ends of one
    agent's sessions therefore queue on the stream before either locks an experience; taking the
    stream only at the first promotion's event let each hold what the other needed next.
    """
    now = now or timezone.now()
    with transaction.atomic():
        updated = Session.objects.filter(pk=session.pk, tenant=tenant, status=SessionStatus.OPEN).update(
            status=SessionStatus.ENDED, ended_at=now, last_accessed_at=now, expires_at=None
        )
        session.refresh_from_db()
        if not updated:
            return session
        recorder.stream_lock(tenant=tenant, agent=session.agent)
        decay.facts_on_session_end(tenant=tenant, session=session)
        session_digest_queue(session=session)  # its digest, for the same user's next session
        recorder.event_append(
            tenant=tenant,
            type="session.ended",
            session=session,
            payload={"message_count": session.message_count, "token_count": session.token_count},
        )
    return session


def session_delete(*, tenant: Tenant, session: Session) -> None:
    """Delete a session, what it holds and what was derived from it alone (session_erasure.py):
    the user memories and experiences taken only from it, its texts' embedding-cache rows.

    Its events stay as tombstones, the audit trail without content (as forgetting a user leaves
    them: type, time, stream, seq and ids; their `session` link becomes empty). Its tasks stay,
    unlinked. Records `session.deleted` with the counts (no content).
    """
    with transaction.atomic():
        locked = Session.objects.select_for_update().filter(pk=session.pk, tenant=tenant).first()
        if locked is None:
            raise NotFound.of("session", session.public_id)
        counts = session_erase(tenant=tenant, session=locked)
        recorder.event_append(
            tenant=tenant,
            type="session.deleted",
            agent=session.agent,
            session=session,
            payload={"status": locked.status, "message_count": locked.message_count, "counts": counts},
        )
        locked.delete()


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
