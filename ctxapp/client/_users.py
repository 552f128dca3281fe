"""The client's operations on user memory: what is known about each user of the tenant, listed
(now or `as_of` a past moment), recorded, corrected, erased and traced through its versions.
Each one request builder, written once for both clients (see _core.py)."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import quote

from ctxapp.client._core import Pages, Request, cursor_pages, drop_none, operation, paginated
from ctxapp.client.types import (
    UserMemoryDeletedOut,
    UserMemoryHistoryOut,
    UserMemoryOut,
    UserMemoryPage,
    UserMemoryWrittenOut,
)


def _memories(user_id: str, memory_id: str | None = None) -> str:
    path = f"/users/{quote(user_id, safe='')}/memories"
    return path if memory_id is None else f"{path}/{quote(memory_id, safe='')}"


def _moment(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


class UserMemoryOps:
    """Request builders (no `self`: `@operation` / `@paginated` bind them to a client, which
    sends what they return). `UserMemoryOps.name.build(...)` is the `Request` itself, unsent."""

    @operation
    def user_memories_list(
        user_id: str,
        *,
        as_of: datetime | str | None = None,
        type: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Request[UserMemoryPage]:
        """A page {items, next} of the user's current memories, newest first; `as_of` (a datetime
        or ISO 8601 text): those current at that moment; `type`: profile, preference, decision,
        constraint, plan or fact. NotFound for a user no session or memory of the tenant names."""
        params = {"as_of": _moment(as_of), "type": type, "cursor": cursor, "limit": limit}
        return Request("GET", _memories(user_id), params=params)

    @paginated
    def user_memories_iter(
        user_id: str, *, as_of: datetime | str | None = None, type: str | None = None
    ) -> Pages[UserMemoryOut]:
        """Every memory user_memories_list would list, following the cursor."""
        return cursor_pages(
            lambda cursor: UserMemoryOps.user_memories_list.build(
                user_id, as_of=as_of, type=type, cursor=cursor
            )
        )

    @operation
    def user_memory_get(user_id: str, memory_id: str) -> Request[UserMemoryOut]:
        """One memory of the user, current or superseded."""
        return Request("GET", _memories(user_id, memory_id))

    @operation
    def user_memory_create(
        user_id: str,
        subject: str,
        text: str,
        *,
        type: str | None = None,
        confidence: float | None = None,
        idempotency_key: str | None = None,
    ) -> Request[UserMemoryWrittenOut]:
        """Record the current value of `subject` for the user. `outcome`: created, superseded (the
        previous value ended: `supersedes`) or unchanged (the same text again)."""
        body = drop_none({"subject": subject, "text": text, "type": type, "confidence": confidence})
        return Request("POST", _memories(user_id), json=body, idempotency_key=idempotency_key)

    @operation
    def user_memory_update(
        user_id: str,
        memory_id: str,
        *,
        text: str | None = None,
        type: str | None = None,
        confidence: float | None = None,
        idempotency_key: str | None = None,
    ) -> Request[UserMemoryWrittenOut]:
        """Correct a current memory: the answer is a NEW version (its own id) superseding it.
        Conflict (`memory_superseded`) when the memory is no longer current."""
        body = drop_none({"text": text, "type": type, "confidence": confidence})
        return Request("PATCH", _memories(user_id, memory_id), json=body, idempotency_key=idempotency_key)

    @operation
    def user_memory_delete(
        user_id: str, memory_id: str, *, idempotency_key: str | None = None
    ) -> Request[UserMemoryDeletedOut]:
        """Erase the memory and every earlier version of its subject: {deleted: [ids], count}."""
        return Request("DELETE", _memories(user_id, memory_id), idempotency_key=idempotency_key)

    @operation
    def user_memory_history(user_id: str, memory_id: str) -> Request[UserMemoryHistoryOut]:
        """Every version of the memory's subject, oldest first: {items}."""
        return Request("GET", _memories(user_id, memory_id) + "/history")
