"""What a key bound to an agent reaches inside its tenant: the one rule, for every surface.

docs/reliability.md ("What a key bound to an agent reaches") states the rule; every surface (REST
views, the MCP tools, which are REST views underneath, the search) asks this module:

- every id it names (an agent, that agent's sessions and tasks: in the path, a query parameter or
  a body field) must be its own agent's, else 403 `agent_mismatch` (`names_check`, run by
  `TenantApiView.initial` before the handler);
- the rows it reads, of every kind, are its own agent's (`rows_visible`): the messages, summaries,
  digests and facts of its agent's sessions, its agent's experiences; another agent's experience
  named by id answers 404 like a missing one;
- user memories: its own agent's, plus every other agent's of the same user where the tenant's
  SharingPolicy shares user memories, and those read-only (`user_memory_change_check`: 403);
- a task's shared context, private context and messages only while its agent takes part in the
  task (`task_participation_check`: 403 `agent_mismatch`).

A key bound to no agent is the tenant's: it reaches every row, and each function here lets it.
Read-only: nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Q

from memory.exceptions import AgentMismatch
from memory.models import IpcMessage, PrivateContext, Session, Task, Tenant
from memory.services.sharing import user_memory_reader_filter

# The kinds `rows_visible` answers for, each a Q over its own model.
ROW_KINDS = ("session", "message", "summary", "digest", "fact", "experience", "user_memory", "task")
_BY_SESSION_AGENT = {
    "session": "agent__external_id",
    "message": "session__agent__external_id",
    "summary": "session__agent__external_id",
    "digest": "session__agent__external_id",
    "fact": "session__agent__external_id",
    "task": "agent__external_id",
}


def rows_visible(*, tenant: Tenant, agent: str, kind: str) -> Q:
    """The rows of `kind` (ROW_KINDS) a key bound to `agent` may read, as a Q over that kind's
    model; Q() (every row) for a key bound to no agent (`agent` ""). Read-only.

    A row with an empty agent (recorded by a key bound to no agent) is no agent's own.
    """
    if kind not in ROW_KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    if not agent:
        return Q()
    if kind == "experience":
        return Q(agent=agent)
    if kind == "user_memory":
        return user_memory_reader_filter(tenant=tenant, agent=agent)
    return Q(**{_BY_SESSION_AGENT[kind]: agent})


def rows_changeable(*, agent: str) -> Q:
    """The experiences and user memories a key bound to `agent` may change or delete (their
    `agent` column): its own agent's only, whatever is shared. Q() for a key bound to no agent."""
    return Q(agent=agent) if agent else Q()


def user_memory_change_check(*, agent: str, owner: str) -> None:
    """Refuse a key bound to `agent` changing a user memory another agent wrote (`owner`), which
    the sharing policy may let it read. Raises AgentMismatch (403); another agent's name is not
    disclosed."""
    if agent and owner != agent:
        raise AgentMismatch(
            f"This API key is bound to agent {agent!r}: it may read this memory (the tenant shares "
            "user memories) but change only its own agent's.",
            details={"bound_agent": agent},
        )


def names_check(
    *,
    tenant: Tenant,
    bound_agent: str,
    agents: Iterable[str] = (),
    session_ids: Iterable[str] = (),
    task_ids: Iterable[str] = (),
) -> None:
    """Refuse a key bound to `bound_agent` that names another agent, or another agent's session or task.

    Read-only: one query per kind of id named. Raises AgentMismatch (403 `agent_mismatch`,
    `details.bound_agent` / `details.requested_agent`). Ids that name nothing of this tenant pass:
    the view answers them 404 like any unknown id. A task without an agent belongs to no one.
    """
    requested = {name for name in agents if name}
    session_ids, task_ids = [s for s in session_ids if s], [t for t in task_ids if t]
    if session_ids:
        requested.update(
            Session.objects.filter(tenant=tenant, public_id__in=session_ids).values_list(
                "agent__external_id", flat=True
            )
        )
    if task_ids:
        requested.update(
            Task.objects.filter(tenant=tenant, public_id__in=task_ids, agent__isnull=False).values_list(
                "agent__external_id", flat=True
            )
        )
    others = sorted(requested - {bound_agent})
    if others:
        raise AgentMismatch(
            f"This API key is bound to agent {bound_agent!r}; it cannot act as or on agent {others[0]!r} "
            "(its sessions, tasks, state and events included).",
            details={"bound_agent": bound_agent, "requested_agent": others[0]},
        )


def task_takes_part(*, task: Task, agent: str) -> bool:
    """Whether agent `agent` takes part in `task`: the task is its own or no agent's, a message on
    the task was sent to it or by it, or it holds private context on it. Read-only.

    Only a participant may send on a task or write its private context there (see
    `task_participation_check`), so an agent joins another's task only when a participant (or a
    key bound to no agent) sends it a message there.
    """
    if task.agent_id is None or (task.agent is not None and task.agent.external_id == agent):
        return True
    messaged = IpcMessage.objects.filter(task=task).filter(
        Q(recipient__external_id=agent) | Q(sender__external_id=agent)
    )
    return messaged.exists() or PrivateContext.objects.filter(task=task, agent__external_id=agent).exists()


def task_participation_check(*, task: Task, bound_agent: str) -> None:
    """Refuse a key bound to an agent that takes no part in `task` (task_takes_part): 403
    `agent_mismatch`, as for another agent's task. A key bound to no agent passes. Read-only."""
    if bound_agent and not task_takes_part(task=task, agent=bound_agent):
        owner = task.agent.external_id if task.agent is not None else ""
        raise AgentMismatch(
            f"This API key is bound to agent {bound_agent!r}, which takes no part in task "
            f"{task.public_id}: a participant must send it a message on the task first.",
            details={"bound_agent": bound_agent, "requested_agent": owner},
        )
