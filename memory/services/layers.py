"""The three context layers of a task: shared context, agent-private context, inter-agent messages.

- Task-shared context (goal, constraints, artifacts, decisions, dependencies): every agent on the
  task reads and writes it; optimistic versioning (`expected_version`) guards concurrent writers.
- Agent-private context: one JSON object per agent per task; only that agent ever reads it. No
  function here returns another agent's private context, and events about it carry no content.
- Inter-agent messages: to one agent or broadcast (recipient None), with per-reader read state.

Every read returns fresh copies (new JSON decoded from the database), never stored objects.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from memory.exceptions import InvalidInput, NotFound, VersionConflict
from memory.models import (
    Agent,
    IpcMessage,
    IpcReceipt,
    PrivateContext,
    Task,
    TaskContext,
    TaskStatus,
    Tenant,
)
from memory.services import recorder
from memory.services.cognition.jsondiff import json_text
from memory.services.cognition.schema import state_check_size

SHARED_FIELDS = ("goal", "constraints", "artifacts", "decisions", "dependencies")
SHARED_LIST_FIELDS = ("constraints", "artifacts", "decisions", "dependencies")


def task_get(*, tenant: Tenant, task_id: str) -> Task:
    """The tenant's task, or NotFound (identical for a missing id and another tenant's). Read-only."""
    task = Task.objects.select_related("agent").filter(tenant=tenant, public_id=task_id).first()
    if task is None:
        raise NotFound.of("task", task_id)
    return task


# --- task-shared context -----------------------------------------------------------------------


def _shared_dict(task: Task, row: TaskContext | None) -> dict[str, Any]:
    if row is None:
        return {
            "task": task.public_id,
            "goal": "",
            "constraints": [],
            "artifacts": [],
            "decisions": [],
            "dependencies": [],
            "version": 0,
            "updated_by": None,
            "updated_at": None,
        }
    return {
        "task": task.public_id,
        "goal": row.goal,
        "constraints": copy.deepcopy(row.constraints),
        "artifacts": copy.deepcopy(row.artifacts),
        "decisions": copy.deepcopy(row.decisions),
        "dependencies": copy.deepcopy(row.dependencies),
        "version": row.version,
        "updated_by": row.updated_by.external_id if row.updated_by_id else None,  # type: ignore[union-attr]
        "updated_at": row.updated_at.isoformat(),
    }


def shared_context_get(*, tenant: Tenant, task: Task) -> dict[str, Any]:
    """The task's shared context (empty at version 0 if never written). Read-only; a fresh copy."""
    row = TaskContext.objects.select_related("updated_by").filter(tenant=tenant, task=task).first()
    return _shared_dict(task, row)


def shared_context_write(
    *,
    tenant: Tenant,
    task: Task,
    values: dict[str, Any],
    append: dict[str, list[Any]] | None = None,
    replace: bool,
    agent: Agent | None = None,
    expected_version: int | None = None,
) -> dict[str, Any]:
    """Write the task's shared context under its row lock and return it.

    `replace` (PUT): fields not given are reset. Otherwise (PATCH) only the given fields change,
    and `append` adds items to list fields (safe for concurrent agents without a version).
    `expected_version` → VersionConflict (409) if it differs. Records `task_context.updated`
    (the names of the changed fields) on the writing agent's stream, or the tenant stream.
    """
    with transaction.atomic():
        TaskContext.objects.get_or_create(task=task, defaults={"tenant": tenant})
        row = TaskContext.objects.select_for_update().get(task=task)
        if expected_version is not None and expected_version != row.version:
            raise VersionConflict(details={"expected_version": expected_version, "version": row.version})
        before = _shared_dict(task, row)
        if replace:
            row.goal, row.constraints, row.artifacts, row.decisions, row.dependencies = "", [], [], [], []
        for field in SHARED_FIELDS:
            if field in values:
                setattr(row, field, copy.deepcopy(values[field]))
        for field, items in (append or {}).items():
            setattr(row, field, [*getattr(row, field), *copy.deepcopy(items)])
        state_check_size(json_text({f: getattr(row, f) for f in SHARED_FIELDS}), "shared context")
        row.version += 1
        row.updated_by = agent
        row.updated_at = timezone.now()
        row.save()
        after = _shared_dict(task, row)
        changed = [f for f in SHARED_FIELDS if before[f] != after[f]]
        recorder.event_append(
            tenant=tenant,
            type="task_context.updated",
            agent=agent,
            payload={"task": task.public_id, "version": row.version, "changed": changed},
        )
        return after


# --- agent-private context ---------------------------------------------------------------------


@dataclass
class PrivateView:
    task: str
    agent: str
    data: dict[str, Any]
    version: int
    updated_at: str | None


def private_context_get(*, tenant: Tenant, task: Task, agent: Agent) -> PrivateView:
    """`agent`'s own private context on `task` (empty at version 0). Read-only; a fresh copy.

    The caller must have established that `agent` is the one asking; nothing here returns
    another agent's context.
    """
    row = PrivateContext.objects.filter(tenant=tenant, task=task, agent=agent).first()
    if row is None:
        return PrivateView(task.public_id, agent.external_id, {}, 0, None)
    return PrivateView(
        task.public_id, agent.external_id, json.loads(row.document), row.version, row.updated_at.isoformat()
    )


def private_context_put(
    *, tenant: Tenant, task: Task, agent: Agent, data: dict[str, Any], expected_version: int | None = None
) -> PrivateView:
    """Replace `agent`'s private context on `task`. Records `private_context.updated` on the agent's
    stream with the version only (events are readable tenant-wide; the content never goes there)."""
    if not isinstance(data, dict):
        raise InvalidInput(
            "The private context must be a JSON object.", details={"fields": {"data": ["Not an object."]}}
        )
    text = json_text(data)
    state_check_size(text, "private context")
    with transaction.atomic():
        PrivateContext.objects.get_or_create(task=task, agent=agent, defaults={"tenant": tenant})
        row = PrivateContext.objects.select_for_update().get(task=task, agent=agent)
        if expected_version is not None and expected_version != row.version:
            raise VersionConflict(details={"expected_version": expected_version, "version": row.version})
        row.document = text
        row.version += 1
        row.updated_at = timezone.now()
        row.save(update_fields=["document", "version", "updated_at"])
        recorder.event_append(
            tenant=tenant,
            type="private_context.updated",
            agent=agent,
            payload={"task": task.public_id, "version": row.version},
        )
        return PrivateView(
            task.public_id, agent.external_id, json.loads(text), row.version, row.updated_at.isoformat()
        )


# --- inter-agent messages ----------------------------------------------------------------------


def ipc_send(*, tenant: Tenant, task: Task, sender: Agent, recipient: Agent | None, body: Any) -> IpcMessage:
    """Send `body` from `sender` to `recipient` (None = broadcast to every agent on the task).

    Records `ipc.sent` on the sender's stream (ids only, not the body).
    """
    with transaction.atomic():
        message = IpcMessage.objects.create(
            tenant=tenant, task=task, sender=sender, recipient=recipient, body=body
        )
        recorder.event_append(
            tenant=tenant,
            type="ipc.sent",
            agent=sender,
            payload={
                "task": task.public_id,
                "message": message.public_id,
                "to": recipient.external_id if recipient else None,
            },
        )
    return message


def _visible_to(agent: Agent) -> Q:
    return Q(recipient=agent) | Q(recipient__isnull=True) | Q(sender=agent)


def ipc_list(*, tenant: Tenant, task: Task, agent: Agent, box: str = "all", unread_only: bool = False) -> Any:
    """Messages on `task` that `agent` may see: sent to it, broadcast, or sent by it (box `all`);
    `inbox` = to it or broadcast by others; `sent` = by it. Annotated with `is_read` for `agent`.
    Read-only; returns a QuerySet ordered oldest first (views paginate it)."""
    queryset = IpcMessage.objects.filter(tenant=tenant, task=task).select_related("sender", "recipient")
    if box == "inbox":
        queryset = queryset.filter(Q(recipient=agent) | (Q(recipient__isnull=True) & ~Q(sender=agent)))
    elif box == "sent":
        queryset = queryset.filter(sender=agent)
    else:
        queryset = queryset.filter(_visible_to(agent))
    queryset = queryset.annotate(
        is_read=Exists(IpcReceipt.objects.filter(message=OuterRef("pk"), agent=agent))
    )
    if unread_only:
        queryset = queryset.filter(is_read=False)
    return queryset


def ipc_mark_read(*, tenant: Tenant, task: Task, agent: Agent, message_ids: list[str] | None = None) -> int:
    """Mark messages of `agent`'s inbox on `task` read (all unread ones when `message_ids` is None).

    Idempotent: already-read messages are skipped. Ids not in the agent's inbox → NotFound.
    Records `ipc.read` with the count when something changed.
    """
    inbox = ipc_list(tenant=tenant, task=task, agent=agent, box="inbox")
    if message_ids is not None:
        found = set(inbox.filter(public_id__in=message_ids).values_list("public_id", flat=True))
        missing = [mid for mid in message_ids if mid not in found]
        if missing:
            raise NotFound.of("message", missing[0])
        inbox = inbox.filter(public_id__in=message_ids)
    with transaction.atomic():
        pending = list(inbox.filter(is_read=False).values_list("pk", flat=True))
        now = timezone.now()
        IpcReceipt.objects.bulk_create(
            [IpcReceipt(message_id=pk, agent=agent, read_at=now) for pk in pending], ignore_conflicts=True
        )
        if pending:
            recorder.event_append(
                tenant=tenant,
                type="ipc.read",
                agent=agent,
                payload={"task": task.public_id, "count": len(pending)},
            )
    return len(pending)


def ipc_dict(message: IpcMessage) -> dict[str, Any]:
    return {
        "id": message.public_id,
        "task": message.task.public_id if hasattr(message, "task") else None,
        "from": message.sender.external_id,
        "to": message.recipient.external_id if message.recipient_id else None,  # type: ignore[union-attr]
        "broadcast": message.recipient_id is None,
        "body": copy.deepcopy(message.body),
        "read": bool(getattr(message, "is_read", False)),
        "created_at": message.created_at.isoformat(),
    }


def ipc_unread_for_agent(*, tenant: Tenant, agent: Agent) -> list[dict[str, Any]]:
    """`agent`'s unread messages on every task, oldest first. Read-only."""
    queryset = (
        IpcMessage.objects.filter(tenant=tenant)
        .filter(Q(recipient=agent) | (Q(recipient__isnull=True) & ~Q(sender=agent)))
        .annotate(is_read=Exists(IpcReceipt.objects.filter(message=OuterRef("pk"), agent=agent)))
        .filter(is_read=False)
        .select_related("sender", "recipient", "task")
        .order_by("pk")[:200]
    )
    return [ipc_dict(m) for m in queryset]


# --- views -------------------------------------------------------------------------------------


def context_view(*, tenant: Tenant, task: Task, agent: Agent) -> dict[str, Any]:
    """What `agent` sees of `task`: the shared context, its own private context and its inbox.

    Read-only (reading does not mark messages read); fresh copies.
    """
    private = private_context_get(tenant=tenant, task=task, agent=agent)
    inbox = ipc_list(tenant=tenant, task=task, agent=agent, box="inbox").order_by("pk")
    return {
        "task": task.public_id,
        "agent": agent.external_id,
        "shared": shared_context_get(tenant=tenant, task=task),
        "private": {"data": private.data, "version": private.version, "updated_at": private.updated_at},
        "inbox": [ipc_dict(m) for m in inbox],
        "unread": sum(1 for m in inbox if not m.is_read),
    }


def tasks_open_for_agent(*, tenant: Tenant, agent: Agent, include_private: bool) -> list[dict[str, Any]]:
    """The agent's unfinished tasks (its own, or ones it holds private context on), each with its
    shared context, and its private context when `include_private`. Read-only."""
    involved = PrivateContext.objects.filter(agent=agent).values("task_id")
    tasks = (
        Task.objects.filter(tenant=tenant)
        .filter(Q(agent=agent) | Q(pk__in=involved))
        .exclude(status__in=TaskStatus.finished())
        .select_related("shared_context__updated_by")
        .order_by("created_at", "pk")[:100]
    )
    result = []
    for task in tasks:
        item: dict[str, Any] = {
            "id": task.public_id,
            "title": task.title,
            "status": task.status,
            "owner": agent.external_id if task.agent_id == agent.pk else None,
            "shared_context": _shared_dict(task, getattr(task, "shared_context", None)),
        }
        if include_private:
            private = private_context_get(tenant=tenant, task=task, agent=agent)
            item["private_context"] = {"data": private.data, "version": private.version}
        result.append(item)
    return result
