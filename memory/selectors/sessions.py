"""Pure reads of agents, sessions, messages and tasks. Nothing here writes (no touch, no event).

Every lookup is scoped to the tenant: another tenant's id raises NotFound exactly like a missing one.
"""

from __future__ import annotations

from django.db.models import Count, IntegerField, Max, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from memory.exceptions import NoSession, NotFound
from memory.models import Agent, Message, Session, Task, Tenant


def agent_get(*, tenant: Tenant, external_id: str) -> Agent:
    """The tenant's agent, or NotFound (also for another tenant's agent)."""
    agent = Agent.objects.filter(tenant=tenant, external_id=external_id).first()
    if agent is None:
        raise NotFound.of("agent", external_id)
    return agent


def agents_list(
    *, tenant: Tenant, external_id: str | None = None, prefix: str | None = None
) -> QuerySet[Agent]:
    """The tenant's agents (only `external_id`, or those starting with `prefix`, when given), each
    annotated with `session_count`
    (sessions of any status) and `last_active_at` (the latest access to one of its sessions, or
    None). Per-agent subqueries, so a page of agents costs its rows, not the tenant's sessions."""
    sessions = Session.objects.filter(agent=OuterRef("pk")).order_by().values("agent")
    queryset = Agent.objects.filter(tenant=tenant)
    if external_id is not None:
        queryset = queryset.filter(external_id=external_id)
    if prefix:
        queryset = queryset.filter(external_id__startswith=prefix)
    return queryset.annotate(
        session_count=Coalesce(
            Subquery(sessions.annotate(n=Count("pk")).values("n"), output_field=IntegerField()), 0
        ),
        last_active_at=Subquery(sessions.annotate(at=Max("last_accessed_at")).values("at")),
    )


def agent_detail(*, tenant: Tenant, external_id: str) -> Agent:
    """One agent with agents_list's annotations, or NotFound (also for another tenant's)."""
    agent = agents_list(tenant=tenant, external_id=external_id).first()
    if agent is None:
        raise NotFound.of("agent", external_id)
    return agent


def session_get(*, tenant: Tenant, session_id: str) -> Session:
    """The tenant's session, or NotFound — identical for a missing id and another tenant's id.

    Read-only: viewing a session does not move its idle expiry (agent reads use
    memory.services.sessions.session_access).
    """
    session = Session.objects.select_related("agent").filter(tenant=tenant, public_id=session_id).first()
    if session is None:
        raise NotFound.of("session", session_id)
    return session


def session_by_key(*, tenant: Tenant, agent_external_id: str, key: str) -> Session:
    """The agent's session with the application's `key`, or NotFound (also for another tenant's)."""
    session = (
        Session.objects.select_related("agent")
        .filter(tenant=tenant, agent__external_id=agent_external_id, key=key)
        .first()
    )
    if session is None:
        raise NotFound(
            f"Agent {agent_external_id!r} has no session with key {key[:200]!r}.",
            details={"agent": agent_external_id, "key": key},
        )
    return session


def sessions_list(
    *,
    tenant: Tenant,
    agent_external_id: str | None = None,
    user_id: str | None = None,
    status: str | None = None,
) -> QuerySet[Session]:
    """The tenant's sessions, filtered (the caller pages it, newest first)."""
    queryset = Session.objects.filter(tenant=tenant).select_related("agent")
    if agent_external_id is not None:
        queryset = queryset.filter(agent__external_id=agent_external_id)
    if user_id is not None:
        queryset = queryset.filter(user_id=user_id)
    if status is not None:
        queryset = queryset.filter(status=status)
    return queryset


def session_latest(*, tenant: Tenant, agent_external_id: str) -> Session:
    """The agent's most recently created session (any status).

    Raises NotFound for an unknown agent and NoSession (404 `no_session`) for an agent without one.
    """
    agent = agent_get(tenant=tenant, external_id=agent_external_id)
    session = (
        Session.objects.select_related("agent")
        .filter(tenant=tenant, agent=agent)
        .order_by("-created_at", "-pk")
        .first()
    )
    if session is None:
        raise NoSession(
            f"Agent {agent_external_id!r} has no session yet: create one with POST /api/v1/sessions.",
            details={"agent": agent_external_id},
        )
    return session


def messages_after(
    *, tenant: Tenant, session: Session, after_seq: int = 0, limit: int = 100
) -> list[Message]:
    """The session's messages with seq > after_seq, oldest first."""
    return list(
        Message.objects.filter(tenant=tenant, session=session, seq__gt=after_seq).order_by("seq")[:limit]
    )


def task_get(*, tenant: Tenant, task_id: str) -> Task:
    """The tenant's task, or NotFound (also for another tenant's task)."""
    task = Task.objects.select_related("session", "agent").filter(tenant=tenant, public_id=task_id).first()
    if task is None:
        raise NotFound.of("task", task_id)
    return task


def tasks_list(
    *,
    tenant: Tenant,
    session_id: str | None = None,
    agent_external_id: str | None = None,
    user_id: str | None = None,
    status: str | None = None,
) -> QuerySet[Task]:
    """The tenant's tasks, filtered (the caller pages it, newest first)."""
    queryset = Task.objects.filter(tenant=tenant).select_related("session", "agent")
    if session_id is not None:
        queryset = queryset.filter(session__public_id=session_id)
    if agent_external_id is not None:
        queryset = queryset.filter(agent__external_id=agent_external_id)
    if user_id is not None:
        queryset = queryset.filter(user_id=user_id)
    if status is not None:
        queryset = queryset.filter(status=status)
    return queryset
