"""Who may read whose text inside a tenant: the tenant's sharing policy, one switch per kind.

A context build of agent A carries text written outside its own session (a previous session's
digest, recalled messages, summaries and facts, experiences, the user's memories). By default
only what A's own sessions and A's own records hold: another agent's text enters A's prompt
only when the tenant's SharingPolicy shares that kind, and then the manifest names where each
item came from (agent, session). The readers (session_digest, memory search on behalf of a
build, experience_search for the memory slot, context recall) ask this module; they do not
decide it themselves. docs/reliability.md ("Cross-agent memory") has the threat model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from django.db.models import Q

from memory.exceptions import InvalidInput
from memory.models import (
    Experience,
    ExperienceScope,
    Session,
    SharingPolicy,
    Summary,
    Tenant,
    TrackedFact,
)
from memory.services.tenancy import tenant_policy_update

KINDS = ("digests", "messages", "experiences", "user_memories")
POLICY_FIELDS = tuple(f"share_{kind}" for kind in KINDS)


@dataclass(frozen=True)
class Provenance:
    """Where a carried-over item came from: the agent that wrote it and its session (if any)."""

    agent: str
    session: str | None


class RecallHit(Protocol):
    """What sharing needs of a memory search hit (memory_search.SearchHit)."""

    kind: str
    id: str
    session: str | None


def sharing_policy_get(*, tenant: Tenant) -> SharingPolicy:
    """The tenant's sharing policy (created with nothing shared on first use)."""
    return SharingPolicy.for_tenant(tenant)


def sharing_policy_as_dict(policy: SharingPolicy) -> dict[str, bool]:
    return {name: getattr(policy, name) for name in POLICY_FIELDS}


def sharing_policy_update(*, tenant: Tenant, changes: dict[str, Any], actor: str = "api") -> SharingPolicy:
    """Turn sharing of some kinds on or off (POLICY_FIELDS, booleans); the rest keep their value.

    Records `policy.updated` with the old and new values. Raises InvalidInput naming an unknown
    field or a value that is not a boolean; nothing is written then.
    """
    wrong = sorted(
        name for name, value in changes.items() if name in POLICY_FIELDS and not isinstance(value, bool)
    )
    if wrong:
        raise InvalidInput(details={"fields": {name: ["Must be a boolean."] for name in wrong}})
    policy: SharingPolicy = tenant_policy_update(
        model=SharingPolicy, tenant=tenant, changes=changes, fields=POLICY_FIELDS, name="sharing", actor=actor
    )
    return policy


def experience_reader_filter(*, tenant: Tenant, agent: str) -> Q:
    """The experiences a build of `agent` may carry: the ones `agent` recorded, plus tenant-wide
    ones (share_experiences) and the user's own memories (share_user_memories) of any writer.

    A row with an empty `agent` (recorded by a key bound to no agent) is not `agent`'s either."""
    policy = sharing_policy_get(tenant=tenant)
    condition = Q(agent=agent) if agent else Q(pk__in=[])
    if policy.share_experiences:
        condition |= Q(scope=ExperienceScope.TENANT)
    if policy.share_user_memories:
        condition |= Q(scope=ExperienceScope.USER)
    return condition


def user_memory_reader_filter(*, tenant: Tenant, agent: str) -> Q:
    """The user memories (UserMemory rows) a build of `agent` may carry: those taken from `agent`'s
    sessions or recorded by a key bound to it, plus (share_user_memories) every other writer's.
    As for experiences, a row with an empty `agent` is not `agent`'s."""
    if sharing_policy_get(tenant=tenant).share_user_memories:
        return Q()
    return Q(agent=agent) if agent else Q(pk__in=[])


def digest_reader_filter(*, tenant: Tenant, session: Session) -> Q:
    """The session digests a build of `session` may be offered: its own agent's, or (share_digests)
    those of every agent."""
    if sharing_policy_get(tenant=tenant).share_digests:
        return Q()
    return Q(session__agent_id=session.agent_id)


def recall_agent_scope(*, tenant: Tenant, session: Session) -> str | None:
    """The agent a build's recall search is narrowed to: the session's own, unless the tenant
    shares messages or digests (then None: every agent's sessions of the user, and
    `recall_provenance` keeps each kind to what the policy shares)."""
    policy = sharing_policy_get(tenant=tenant)
    if policy.share_messages or policy.share_digests:
        return None
    return session.agent.external_id


def _column_by_id(queryset: Any, ids: Iterable[str], column: str) -> dict[str, str]:
    """public id → `column` of the rows of `queryset` among `ids` (one query; none for no ids)."""
    wanted = set(ids)
    if not wanted:
        return {}
    return dict(queryset.filter(public_id__in=wanted).values_list("public_id", column))


def _hit_session(hit: RecallHit, summaries: dict[str, str], facts: dict[str, str]) -> str | None:
    if hit.kind == "message":
        return hit.session
    if hit.kind == "summary":
        return summaries.get(hit.id) or hit.id.split("/digest/", 1)[0]
    if hit.kind == "fact":
        return facts.get(hit.id)
    return None


def _kind_of(hit: RecallHit) -> str:
    if hit.kind == "summary" and "/digest/" in hit.id:
        return "digests"
    return "messages"


def recall_provenance(
    *, tenant: Tenant, session: Session, hits: Iterable[RecallHit]
) -> dict[tuple[str, str], Provenance | None]:
    """For each recall hit, keyed (kind, id): where it came from, or None when the tenant's policy
    does not let a build of `session` read it (another agent's, of a kind not shared). Read-only."""
    hits = list(hits)
    own = session.agent.external_id
    policy = sharing_policy_get(tenant=tenant)
    of_kind = {kind: [h.id for h in hits if h.kind == kind] for kind in ("summary", "fact")}
    summaries = _column_by_id(Summary.objects.filter(tenant=tenant), of_kind["summary"], "session__public_id")
    facts = _column_by_id(TrackedFact.objects.filter(tenant=tenant), of_kind["fact"], "session__public_id")
    experiences = {
        row["public_id"]: row
        for row in Experience.objects.filter(
            tenant=tenant, public_id__in=[h.id for h in hits if h.kind == "experience"]
        ).values("public_id", "agent", "scope", "source_session__public_id")
    }
    sessions = {h.id: _hit_session(h, summaries, facts) for h in hits if h.kind != "experience"}
    agents = _column_by_id(
        Session.objects.filter(tenant=tenant), (s for s in sessions.values() if s), "agent__external_id"
    )
    shared = {kind: getattr(policy, f"share_{kind}") for kind in KINDS}
    out: dict[tuple[str, str], Provenance | None] = {}
    for hit in hits:
        if hit.kind == "experience":
            row = experiences.get(hit.id)
            if row is None:
                out[(hit.kind, hit.id)] = None
                continue
            kind = "user_memories" if row["scope"] == ExperienceScope.USER else "experiences"
            where = Provenance(agent=row["agent"], session=row["source_session__public_id"])
        else:
            kind = _kind_of(hit)
            source = sessions.get(hit.id)
            where = Provenance(agent=agents.get(source or "", ""), session=source)
        allowed = (where.agent == own and bool(own)) or shared[kind]
        out[(hit.kind, hit.id)] = where if allowed else None
    return out


def is_shared(*, reader_agent: str, provenance: Provenance) -> bool:
    """Whether an item crossed agents (the manifest marks it `shared`)."""
    return provenance.agent != reader_agent
