"""Read-only queries behind the dashboard pages. Every function is scoped to one tenant.

Nothing here writes. Each function runs a bounded number of queries whatever the data size
(keyset pages, LIMITs, indexed ranges), so a 100,000-message session renders as fast as an
empty one. Capabilities that have not landed yet are detected, never faked: their selectors
return None and the panel says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Max, Q
from django.db.models.functions import TruncMinute
from django.utils import timezone

from dashboard.timeline import shorten
from memory.models import (
    Agent,
    Event,
    Experience,
    Message,
    Session,
    SessionStatus,
    Tenant,
    TrackedFact,
    UserMemory,
)
from memory.replica import read_alias
from memory.services.recorder import stream_key

MESSAGE_PAGE_SIZE = 50
EVENT_PAGE_SIZE = 50
RECENT_EVENTS = 15
RATE_WINDOW_MINUTES = 30


# --- overview -------------------------------------------------------------------------------


@dataclass
class OverviewStats:
    agents: int
    open_sessions: int
    messages_last_minute: int
    messages_per_minute: list[int]
    events_last_hour: int
    failures_last_day: int


def overview_stats(*, tenant: Tenant, now: datetime | None = None) -> OverviewStats:
    """Counts for the overview cards; messages per minute from `message.added` events (indexed)."""
    now = now or timezone.now()
    since = now - timedelta(minutes=RATE_WINDOW_MINUTES)
    per_minute = dict(
        Event.objects.using(read_alias())
        .filter(tenant=tenant, type="message.added", created_at__gte=since)
        .annotate(minute=TruncMinute("created_at"))
        .values_list("minute")
        .annotate(n=Count("id"))
        .values_list("minute", "n")
    )
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=RATE_WINDOW_MINUTES - 1)
    series = [per_minute.get(start + timedelta(minutes=i), 0) for i in range(RATE_WINDOW_MINUTES)]
    return OverviewStats(
        agents=Agent.objects.using(read_alias()).filter(tenant=tenant).count(),
        open_sessions=Session.objects.using(read_alias())
        .filter(tenant=tenant, status=SessionStatus.OPEN)
        .count(),
        messages_last_minute=series[-1],
        messages_per_minute=series,
        events_last_hour=Event.objects.using(read_alias())
        .filter(tenant=tenant, created_at__gte=now - timedelta(hours=1))
        .count(),
        failures_last_day=failed_events(tenant=tenant, since=now - timedelta(days=1)).count(),
    )


def agents_recent(*, tenant: Tenant, limit: int = 20) -> list[Agent]:
    """The most recently active agents with their open-session count and last activity."""
    return list(
        Agent.objects.using(read_alias())
        .filter(tenant=tenant)
        .annotate(
            open_sessions=Count("sessions", filter=Q(sessions__status=SessionStatus.OPEN)),
            last_seen=Max("sessions__last_accessed_at"),
        )
        .order_by(F("last_seen").desc(nulls_last=True), "external_id")[:limit]
    )


def sessions_open(*, tenant: Tenant, limit: int = 15) -> list[Session]:
    return list(
        Session.objects.using(read_alias())
        .filter(tenant=tenant, status=SessionStatus.OPEN)
        .select_related("agent")
        .order_by("-last_accessed_at")[:limit]
    )


def sessions_recent(*, tenant: Tenant, agent: Agent | None = None, limit: int = 20) -> list[Session]:
    qs = Session.objects.using(read_alias()).filter(tenant=tenant).select_related("agent")
    if agent is not None:
        qs = qs.filter(agent=agent)
    return list(qs.order_by("-created_at")[:limit])


def events_recent(*, tenant: Tenant, limit: int = RECENT_EVENTS) -> list[Event]:
    return list(
        Event.objects.using(read_alias()).filter(tenant=tenant).order_by("-created_at", "-id")[:limit]
    )


def failed_events(*, tenant: Tenant, since: datetime | None = None) -> Any:
    """Events that report a failed background job (`*.failed`, `*_failed`), newest first.

    Agent-emitted events (`agent.*`, e.g. a failed tool call) are the agent's business, not jobs.
    """
    qs = (
        Event.objects.using(read_alias())
        .filter(tenant=tenant)
        .filter(Q(type__endswith=".failed") | Q(type__endswith="_failed"))
        .exclude(type__startswith="agent.")
    )
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    return qs.order_by("-created_at", "-id")


# --- session ----------------------------------------------------------------------------------


@dataclass
class MessagePage:
    messages: list[Message]
    older_before: int | None  # pass as ?before= to get the next older page; None = no older


def messages_page(
    *, tenant: Tenant, session: Session, before: int | None = None, limit: int = MESSAGE_PAGE_SIZE
) -> MessagePage:
    """One page of a session's messages, newest first, older than seq `before` (keyset on seq)."""
    qs = Message.objects.using(read_alias()).filter(tenant=tenant, session=session)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: limit + 1])
    older = rows[limit - 1].seq if len(rows) > limit else None
    return MessagePage(messages=rows[:limit], older_before=older)


def messages_after(
    *, tenant: Tenant, session: Session, after: int, limit: int = MESSAGE_PAGE_SIZE
) -> list[Message]:
    """Messages with seq > after, newest first, at most `limit` (the newest ones if more)."""
    return list(
        Message.objects.using(read_alias())
        .filter(tenant=tenant, session=session, seq__gt=after)
        .order_by("-seq")[:limit]
    )


def session_events(*, tenant: Tenant, session: Session, types: list[str], limit: int = 200) -> list[Event]:
    return list(
        Event.objects.using(read_alias())
        .filter(tenant=tenant, session=session, type__in=types)
        .order_by("-created_at", "-id")[:limit]
    )


# --- agent ------------------------------------------------------------------------------------


@dataclass
class EventFilter:
    type: str = ""
    session: str = ""
    before: int | None = None  # seq keyset


@dataclass
class EventPage:
    events: list[Event]
    older_before: int | None
    types: list[str] = field(default_factory=list)


def agent_events(
    *, tenant: Tenant, agent: Agent, filters: EventFilter, limit: int = EVENT_PAGE_SIZE
) -> EventPage:
    """The agent's event log, newest first, filtered by type prefix and session id, keyset on seq."""
    qs = Event.objects.using(read_alias()).filter(tenant=tenant, stream=stream_key(agent))
    if filters.type:
        qs = qs.filter(type__startswith=filters.type)
    if filters.session:
        qs = qs.filter(session__public_id=filters.session)
    if filters.before is not None:
        qs = qs.filter(seq__lt=filters.before)
    rows = list(qs.select_related("session").order_by("-seq")[: limit + 1])
    older = rows[limit - 1].seq if len(rows) > limit else None
    return EventPage(events=rows[:limit], older_before=older)


def event_type_choices(*, tenant: Tenant, agent: Agent) -> list[str]:
    """The event type families seen in the agent's recent events (for the filter menu)."""
    recent = (
        Event.objects.using(read_alias())
        .filter(tenant=tenant, stream=stream_key(agent))
        .order_by("-seq")
        .values_list("type", flat=True)
    )[:500]
    families = {t.split(".")[0] for t in recent}
    return sorted(families | {t for t in recent})


def fact_keys(*, tenant: Tenant, fact_ids: list[str]) -> dict[str, str]:
    """The key of each tracked fact by public id (one query; foreign or missing ids are absent)."""
    if not fact_ids:
        return {}
    return dict(
        TrackedFact.objects.using(read_alias())
        .filter(tenant=tenant, public_id__in=fact_ids)
        .values_list("public_id", "key")
    )


def id_owner(*, tenants: Any, session_id: str | None, agent_id: str | None) -> Tenant | None:
    """Which of `tenants` holds this session (or, without one, this agent): the user's other
    tenant a link points into. One query; None when none of them does."""
    if session_id:
        session = Session.objects.using(read_alias()).filter(tenant__in=tenants, public_id=session_id)
        row = session.select_related("tenant").first()
        return row.tenant if row is not None else None
    if agent_id:
        agents = Agent.objects.using(read_alias()).filter(tenant__in=tenants, external_id=agent_id)
        agent = agents.select_related("tenant").first()
        return agent.tenant if agent is not None else None
    return None


def experience_problems(*, tenant: Tenant, experience_ids: list[str]) -> dict[str, str]:
    """The problem each experience solves, by public id, shortened (one query)."""
    if not experience_ids:
        return {}
    rows = (
        Experience.objects.using(read_alias())
        .filter(tenant=tenant, public_id__in=experience_ids)
        .values_list("public_id", "problem")
    )
    return {public_id: shorten(problem, 60) for public_id, problem in rows}


# --- user -----------------------------------------------------------------------------------

USER_SESSIONS = 50
USER_MEMORY_ROWS = 2000  # versions shown on a user page (current values always come first)


@dataclass
class SubjectHistory:
    """One subject of a user's memories: its current value (None once deleted) and every version,
    newest first."""

    subject: str
    current: UserMemory | None
    versions: list[UserMemory]

    @property
    def past(self) -> list[UserMemory]:
        return [v for v in self.versions if v.valid_to is not None]


@dataclass
class UserMemories:
    subjects: list[SubjectHistory]  # subjects with a current value first, then those without
    truncated: bool  # more versions than USER_MEMORY_ROWS


# What the page shows of a memory (not its vector or its text-search column).
MEMORY_COLUMNS = (
    "public_id", "user_id", "subject", "memory_type", "text", "sources", "confidence", "origin", "agent",
    "valid_from", "valid_to", "superseded_by",
)  # fmt: skip


def user_known(*, tenant: Tenant, user_id: str) -> bool:
    """Whether the tenant has a session or a memory (current or past) of the user id."""
    if not user_id:
        return False
    return (
        Session.objects.using(read_alias()).filter(tenant=tenant, user_id=user_id).exists()
        or UserMemory.objects.using(read_alias()).filter(tenant=tenant, user_id=user_id).exists()
    )


def user_memories(*, tenant: Tenant, user_id: str) -> UserMemories:
    """The user's memories by subject, each with its current value and every version, newest
    first (current values are read first, so a long history never hides one). One query."""
    rows = list(
        UserMemory.objects.using(read_alias())
        .filter(tenant=tenant, user_id=user_id)
        .only(*MEMORY_COLUMNS)
        .order_by(F("valid_to").desc(nulls_first=True), "-valid_from", "-id")[: USER_MEMORY_ROWS + 1]
    )
    by_subject: dict[str, SubjectHistory] = {}
    for row in rows[:USER_MEMORY_ROWS]:
        history = by_subject.setdefault(row.subject, SubjectHistory(row.subject, None, []))
        history.versions.append(row)
        if row.valid_to is None:
            history.current = row
    for history in by_subject.values():
        history.versions.sort(key=lambda v: (v.valid_from, v.pk), reverse=True)
    subjects = sorted(by_subject.values(), key=lambda h: (h.current is None, h.subject))
    return UserMemories(subjects, len(rows) > USER_MEMORY_ROWS)


def user_sessions(*, tenant: Tenant, user_id: str) -> tuple[list[Session], int]:
    """The user's newest sessions (at most USER_SESSIONS) and how many there are."""
    queryset = Session.objects.using(read_alias()).filter(tenant=tenant, user_id=user_id)
    sessions = list(queryset.select_related("agent").order_by("-created_at")[:USER_SESSIONS])
    return sessions, (len(sessions) if len(sessions) < USER_SESSIONS else queryset.count())
