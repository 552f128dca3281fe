"""Which session a trace that names no conversation continues: the conversation it re-sends.

OpenInference and OpenLLMetry send each model call's whole input history. A session remembers the
digest of its messages in order (`OtelConversation.history_digest`); a new trace whose history
starts with a session's messages, answer included, continues that session. Reads, and locks the
matching conversation rows."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from memory.models import Agent, MessageRole, OtelConversation, Session, SessionStatus, Tenant
from memory.services import sessions
from memory.services.otel_ingest.messages import fingerprint


def history_digests(marks: Iterable[str], start: str = "") -> list[str]:
    """The digest of each prefix of a conversation (its messages' fingerprints, in order), from
    the digest `start` of what came before. Two conversations whose digests are equal have the
    same messages in the same order."""
    digests: list[str] = []
    for mark in marks:
        start = hashlib.sha256(f"{start}\x1f{mark}".encode()).hexdigest()
        digests.append(start)
    return digests


def message_mark(message: Any) -> str:
    return fingerprint(message.role, message.content, message.tool_call_id, message.tool_calls)


def continued_session(
    *, tenant: Tenant, agent: Agent, history: list[sessions.MessageInput], user_id: str
) -> Session | None:
    """The open session of the agent whose messages are the start of `history` (a trace that
    names no conversation but re-sends one), the longest such start; None when none is. A start
    without an answer of the assistant is not evidence enough of one conversation."""
    digests = history_digests(message_mark(message) for message in history)
    answered = next((i for i, m in enumerate(history) if m.role == MessageRole.ASSISTANT), len(history))
    candidates = digests[answered:]
    if not candidates:
        return None
    rows = list(
        OtelConversation.objects.select_for_update(of=("self",))
        .select_related("session", "session__agent")
        .filter(tenant=tenant, agent=agent, history_digest__in=candidates, session__status=SessionStatus.OPEN)
        .order_by("-id")
    )
    if not rows:
        return None
    longest = max(candidates.index(row.history_digest) for row in rows)
    found = [row.session for row in rows if candidates.index(row.history_digest) == longest]
    # Two users' conversations may have begun alike: the user's own, if the span says who.
    return next((session for session in found if user_id and session.user_id == user_id), found[0])
