"""Memory search's scope: which sessions a search covers, and its arguments validated. Read-only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memory.exceptions import InvalidInput, NotFound
from memory.models import Session, Tenant
from memory.selectors.sessions import agent_get, session_get
from memory.services import ranking
from memory.services.agent_access import rows_visible

KINDS = ("message", "summary", "fact", "experience", "user_memory")
SESSIONS_CHOICES = ("current", "all")
MAX_LIMIT = 100
MAX_NEIGHBOURS = 5


@dataclass(frozen=True)
class SearchScope:
    agent: str | None = None
    user_id: str | None = None
    session: str | None = None
    sessions: str = "all"  # "current" (only `session`) | "all"
    # The agent a context build searches for: experiences narrow to what it may read (sharing.py).
    reader_agent: str | None = None
    # The agent the caller's API key is bound to: every kind narrows to the rows that key may read
    # (memory/services/agent_access.py `rows_visible`), whatever the rest of the scope says.
    bound_agent: str | None = None
    # `session` already loaded, with its agent, when the caller holds it (a context build): the
    # scope is then resolved without reading it, or its agent, again.
    loaded: Session | None = None


def plan_parse(data: Any, *, field_name: str = "plan") -> ranking.Plan:
    """A ranking plan from a request (None → defaults). Raises InvalidInput naming the field."""
    if data is None:
        return ranking.DEFAULT_PLAN
    if not isinstance(data, dict):
        raise InvalidInput(details={"fields": {field_name: ["Expected an object of plan fields."]}})
    try:
        return ranking.Plan.from_dict(data)
    except ValueError as exc:
        name, _, reason = str(exc).partition(":")
        raise InvalidInput(
            f"{field_name}.{name}: {reason.strip()}",
            details={"fields": {f"{field_name}.{name}": [reason.strip()]}},
        ) from exc


def scope_sessions(*, tenant: Tenant, scope: SearchScope) -> tuple[list[int] | None, dict[int, str]]:
    """The session pks the scope covers (None = the whole tenant) and their public ids.

    Raises NotFound for an unknown (or another tenant's) session or agent. Read-only.
    """
    queryset = Session.objects.filter(tenant=tenant)
    if scope.bound_agent:
        queryset = queryset.filter(rows_visible(tenant=tenant, agent=scope.bound_agent, kind="session"))
    current: Session | None = None
    if scope.session:
        loaded = scope.loaded
        if loaded is not None and loaded.tenant_id == tenant.pk and loaded.public_id == scope.session:
            current = loaded
        else:
            current = session_get(tenant=tenant, session_id=scope.session)
        if scope.bound_agent and not queryset.filter(pk=current.pk).exists():  # another agent's
            raise NotFound.of("session", scope.session)
        if scope.sessions == "current":
            return [current.pk], {current.pk: current.public_id}
        if scope.user_id is None and current.user_id:
            queryset = queryset.filter(user_id=current.user_id)
        if scope.agent is None and not current.user_id:
            queryset = queryset.filter(agent_id=current.agent_id)
    if scope.agent and current is not None and current.agent.external_id == scope.agent:
        queryset = queryset.filter(agent_id=current.agent_id)
    elif scope.agent:
        queryset = queryset.filter(agent=agent_get(tenant=tenant, external_id=scope.agent))
    if scope.user_id is not None:
        queryset = queryset.filter(user_id=scope.user_id)
    if not scope.session and not scope.agent and scope.user_id is None and not scope.bound_agent:
        return None, {}
    rows = dict(queryset.values_list("pk", "public_id"))
    return list(rows), rows


def search_validate(
    *, query: str, scope: SearchScope, kinds: list[str] | None, limit: int, neighbours: int
) -> list[str]:
    """The chosen kinds, once every argument is valid. Raises InvalidInput naming the field."""
    if not query:
        raise InvalidInput("query must not be empty.", details={"fields": {"query": ["Must not be empty."]}})
    chosen = list(dict.fromkeys(kinds or KINDS))
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise InvalidInput(
            f"Unknown kind {unknown[0]!r}; kinds are {', '.join(KINDS)}.",
            details={"fields": {"kinds": [f"Unknown kind {k!r}." for k in unknown]}},
        )
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(details={"fields": {"limit": [f"Must be between 1 and {MAX_LIMIT}."]}})
    if not 0 <= neighbours <= MAX_NEIGHBOURS:
        raise InvalidInput(details={"fields": {"neighbours": [f"Must be between 0 and {MAX_NEIGHBOURS}."]}})
    if scope.sessions not in SESSIONS_CHOICES:
        raise InvalidInput(details={"fields": {"scope.sessions": ["Must be 'current' or 'all'."]}})
    if scope.sessions == "current" and not scope.session:
        raise InvalidInput(details={"fields": {"scope.session": ["Required when sessions is 'current'."]}})
    return chosen
