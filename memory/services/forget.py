"""Forgetting a user and redacting a message: the content goes from every place it was copied to.

`forget_user` erases everything a tenant holds of one of its users (the `user_id` on its sessions),
in one transaction of set-based statements: the user's sessions (deleted, not kept as empty shells:
a shell would keep the user id, the session key and metadata), with their messages, summaries,
digests, tracked facts, context builds and OTel mappings; the embedding-cache entries of those
texts; the user's memories, experiences and tasks; the cognitive state and checkpoints of agents
that served no one else; the key-value store items under a namespace naming the user; stored
idempotent responses and queued job payloads naming the sessions. Events stay as tombstones (type,
time, stream, seq and ids; no content). A `user.forgotten` event (ids and counts only) is the audit
record, and what makes a second call answer zero counts instead of 404.

`message_redact` replaces one message's content (and its tool calls' arguments) with a
replacement: its full-text index follows (a generated column); its vector is nulled and the
message queued to be embedded again; the summaries and digest versions covering it are deleted
and re-derived (the digest is queued; the next context build summarises again); tracked facts and
user memories taken from it are deleted; events, context builds and stored responses quoting it
are tombstoned or deleted.

Both bump the tenant's ContentGeneration in the same transaction, for any process-local cache of
the tenant's content to compare against (memory search keeps none: it reads every search's
candidates from PostgreSQL).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q

from memory.exceptions import NotFound
from memory.models import (
    Agent,
    BudgetSample,
    Checkpoint,
    CognitiveState,
    Event,
    Experience,
    IdempotencyRecord,
    JobIntent,
    Message,
    OtelHeldSpan,
    OtelSpan,
    Session,
    SessionDigest,
    StoreItem,
    Summary,
    Task,
    Tenant,
    TrackedFact,
    UserMemory,
)
from memory.services import recorder, tokens
from memory.services.content_generation import content_generation_bump
from memory.services.embedding import text_hash
from memory.services.erasure import (
    cache_entries_delete,
    events_tombstone,
    like_any,
    message_text_hashes,
    sql_execute,
)
from memory.services.message_indexing import (
    embedding_text,
    memory_index_dispatch_on_commit,
    message_index_fields,
)
from memory.services.session_digest import session_digest_queue

__all__ = ["ForgetReceipt", "RedactReceipt", "forget_user", "message_redact"]

FORGOTTEN_EVENT = "user.forgotten"
REDACTED_EVENT = "message.redacted"
# A quoted part of a redacted message: each line or sentence of at least this many characters.
QUOTE_MIN_CHARS = 12


@dataclass
class ForgetReceipt:
    """What forget_user erased, per kind (all zero when there was nothing left)."""

    user_id: str
    counts: dict[str, int] = field(default_factory=dict)


@dataclass
class RedactReceipt:
    session: str
    seq: int
    counts: dict[str, int] = field(default_factory=dict)


# --- forget a user ------------------------------------------------------------------------------


def _was_forgotten(*, tenant: Tenant, user_id: str, agent: Agent | None) -> bool:
    events = Event.objects.filter(tenant=tenant, type=FORGOTTEN_EVENT, payload__user_id=user_id)
    if agent is not None:
        events = events.filter(Q(payload__agent=agent.external_id) | Q(payload__agent=""))
    return events.exists()


def forget_user(*, tenant: Tenant, user_id: str, agent: Agent | None = None) -> ForgetReceipt:
    """Erase everything `tenant` holds of `user_id` (module docstring); idempotent.

    `agent` (a key bound to it): only that agent's sessions of the user and the user's rows that
    agent wrote; the user must have had a session with it. An unknown user → NotFound, like another
    tenant's; a user already forgotten (the audit event) → a receipt of zero counts.
    """
    with transaction.atomic():
        sessions = Session.objects.filter(tenant=tenant, user_id=user_id)
        memories = UserMemory.objects.filter(tenant=tenant, user_id=user_id)
        experiences = Experience.objects.filter(tenant=tenant, user_id=user_id)
        if agent is not None:
            sessions = sessions.filter(agent=agent)
            memories = memories.filter(agent=agent.external_id)
            experiences = experiences.filter(agent=agent.external_id)
        session_rows = list(sessions.select_for_update().values_list("pk", "public_id", "agent_id"))
        session_pks = [pk for pk, _, _ in session_rows]
        session_ids = [public_id for _, public_id, _ in session_rows]
        experiences = experiences | Experience.objects.filter(
            tenant=tenant, source_session_id__in=session_pks
        )
        known = bool(session_rows) or memories.exists() or experiences.exists()
        if agent is None:
            known = known or TrackedFact.objects.filter(tenant=tenant, user_id=user_id).exists()
        if not known:
            if _was_forgotten(tenant=tenant, user_id=user_id, agent=agent):
                return ForgetReceipt(user_id=user_id, counts=dict.fromkeys(_FORGET_KINDS, 0))
            raise NotFound.of("user", user_id)
        counts = _forget_rows(
            tenant=tenant,
            user_id=user_id,
            agent=agent,
            session_pks=session_pks,
            session_ids=session_ids,
            agent_pks=sorted({a for _, _, a in session_rows}),
            memories=memories,
            experiences=experiences,
        )
        content_generation_bump(tenant=tenant)
        recorder.event_append(
            tenant=tenant,
            type=FORGOTTEN_EVENT,
            agent=agent,
            payload={
                "user_id": user_id,
                "agent": agent.external_id if agent is not None else "",
                "sessions": len(session_ids),
                "counts": counts,
            },
        )
    return ForgetReceipt(user_id=user_id, counts=counts)


_FORGET_KINDS = (
    "sessions",
    "messages",
    "embedding_cache",
    "summaries",
    "digests",
    "tracked_facts",
    "user_memories",
    "experiences",
    "tasks",
    "checkpoints",
    "cognitive_states",
    "store_items",
    "events",
    "otel_held_spans",
    "stored_responses",
    "jobs",
)


def _forget_rows(
    *,
    tenant: Tenant,
    user_id: str,
    agent: Agent | None,
    session_pks: list[int],
    session_ids: list[str],
    agent_pks: list[int],
    memories: Any,
    experiences: Any,
) -> dict[str, int]:
    """The erasure's statements, in an order where nothing deleted is needed by a later one."""
    counts = dict.fromkeys(_FORGET_KINDS, 0)
    hashes = message_text_hashes(Message.objects.filter(tenant=tenant, session_id__in=session_pks))
    digests = SessionDigest.objects.filter(tenant=tenant, session_id__in=session_pks)
    if agent is None:
        digests = digests | SessionDigest.objects.filter(tenant=tenant, user_id=user_id)
    hashes |= {text_hash(t) for t in digests.values_list("text", flat=True)}
    for row in experiences.only("problem", "cause", "solution", "text_hash"):
        hashes |= {row.text_hash, text_hash(row.problem_text)}
    hashes |= {text_hash(t) for t in memories.values_list("text", flat=True)}  # as embedded

    # Agents that served no one else: their state and checkpoints are only this user's.
    dedicated = list(
        Agent.objects.filter(tenant=tenant, pk__in=agent_pks)
        .exclude(sessions__in=Session.objects.filter(tenant=tenant).exclude(pk__in=session_pks))
        .values_list("pk", flat=True)
    )
    event_where = ["session_id = ANY(%s)", "agent_id = ANY(%s)", "payload->>'user_id' = %s"]
    event_params: list[Any] = [session_pks, dedicated, user_id]
    erased_ids = list(experiences.values_list("public_id", flat=True))
    erased_ids += list(memories.values_list("public_id", flat=True))
    if erased_ids:
        event_where.append("payload::text LIKE ANY(%s)")
        event_params.append(like_any(erased_ids))
    counts["events"] = events_tombstone(tenant=tenant, where=" OR ".join(event_where), params=event_params)

    counts["messages"] = sql_execute(
        f"DELETE FROM {Message._meta.db_table} WHERE tenant_id = %s AND session_id = ANY(%s)",
        [tenant.pk, session_pks],
    )
    counts["summaries"] = Summary.objects.filter(tenant=tenant, session_id__in=session_pks).delete()[0]
    counts["digests"] = digests.delete()[0]
    facts = TrackedFact.objects.filter(tenant=tenant, session_id__in=session_pks)
    if agent is None:
        facts = facts | TrackedFact.objects.filter(tenant=tenant, user_id=user_id)
    counts["tracked_facts"] = facts.delete()[1].get(TrackedFact._meta.label, 0)
    counts["user_memories"] = memories.delete()[1].get(UserMemory._meta.label, 0)
    counts["experiences"] = experiences.delete()[1].get(Experience._meta.label, 0)
    tasks = Task.objects.filter(tenant=tenant, session_id__in=session_pks)
    if agent is None:
        tasks = tasks | Task.objects.filter(tenant=tenant, user_id=user_id)
    counts["tasks"] = tasks.delete()[1].get(Task._meta.label, 0)
    counts["cognitive_states"] = CognitiveState.objects.filter(
        tenant=tenant, agent_id__in=dedicated
    ).delete()[0]
    counts["checkpoints"] = Checkpoint.objects.filter(tenant=tenant, agent_id__in=dedicated).delete()[0]
    store = StoreItem.objects.filter(tenant=tenant, namespace__contains=[user_id])
    if agent is not None:
        store = store.filter(owner=agent.external_id)
    counts["store_items"] = store.delete()[0]
    traces = OtelSpan.objects.filter(tenant=tenant, session_id__in=session_pks).values("trace_id")
    counts["otel_held_spans"] = OtelHeldSpan.objects.filter(tenant=tenant, trace_id__in=traces).delete()[0]
    patterns = like_any(session_ids) + like_any([json.dumps({"user_id": user_id})[1:-1]])
    counts["stored_responses"] = sql_execute(
        f"DELETE FROM {IdempotencyRecord._meta.db_table} "
        "WHERE tenant_id = %s AND response_body::text LIKE ANY(%s)",
        [tenant.pk, patterns],
    )
    counts["jobs"] = sql_execute(
        f"DELETE FROM {JobIntent._meta.db_table} WHERE tenant_id = %s AND "
        "(payload::text LIKE ANY(%s) OR coalesce(result::text, '') LIKE ANY(%s) OR payload->>'user_id' = %s)",
        [tenant.pk, patterns, patterns, user_id],
    )
    # What the sessions still carry (context builds, usage reports, OTel mappings, policies) goes
    # with them through the model's cascades; their events (tombstoned above) are unlinked.
    counts["sessions"] = Session.objects.filter(pk__in=session_pks).delete()[1].get(Session._meta.label, 0)
    counts["embedding_cache"] = cache_entries_delete(tenant=tenant, hashes=hashes)
    return counts


# --- redact a message ------------------------------------------------------------------------------


def _quotes(text: str) -> list[str]:
    """The parts of `text` a copy would quote: the whole text, and each of its lines and sentences
    of at least QUOTE_MIN_CHARS characters."""
    parts = {text.strip()}
    for line in text.splitlines():
        parts.add(line.strip())
        parts.update(s.strip() for s in re.split(r"(?<=[.!?])\s+", line))
    return sorted(p for p in parts if len(p) >= QUOTE_MIN_CHARS)


def _json_quotes(parts: list[str]) -> list[str]:
    """The parts as they appear inside a JSON text (jsonb's output escapes like json.dumps)."""
    return [json.dumps(p, ensure_ascii=False)[1:-1] for p in parts]


def _tool_calls_redacted(tool_calls: Any, replacement: str) -> Any:
    """The tool calls with their arguments replaced (ids, types and names kept: a tool result
    still answers its call)."""
    if not isinstance(tool_calls, list):
        return []
    redacted = []
    for call in tool_calls:
        if isinstance(call, dict):
            call = dict(call)
            function = call.get("function")
            if isinstance(function, dict):
                call["function"] = {**function, "arguments": json.dumps({"redacted": replacement})}
            for key in ("arguments", "input", "args"):
                if key in call:
                    call[key] = {"redacted": replacement}
        redacted.append(call)
    return redacted


def message_redact(
    *, tenant: Tenant, session: Session, seq: int, replacement: str = "[redacted]"
) -> RedactReceipt:
    """Replace message `seq` of `session` with `replacement` wherever it was copied (module docstring).

    Unknown seq → NotFound. Redacting again with the same replacement changes nothing more.
    """
    with transaction.atomic():
        message = Message.objects.select_for_update().filter(tenant=tenant, session=session, seq=seq).first()
        if message is None:
            raise NotFound.of("message", f"{session.public_id}#{seq}")
        old_tool_calls = json.dumps(message.tool_calls, ensure_ascii=False) if message.tool_calls else ""
        parts = _quotes(message.content)
        for call in message.tool_calls if isinstance(message.tool_calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                parts += _quotes(function["arguments"])
        parts = [p for p in dict.fromkeys(parts) if p not in replacement]
        old_hash = text_hash(
            embedding_text(name=message.name, content=message.content, occurred_at=message.occurred_at)
        )
        counts = _redact_copies(tenant=tenant, session=session, seq=seq, parts=parts)
        new_tool_calls = _tool_calls_redacted(message.tool_calls, replacement)
        changed = message.content != replacement or new_tool_calls != message.tool_calls
        token_count = tokens.count_tokens(replacement)
        if changed:
            Message.objects.filter(pk=message.pk).update(
                content=replacement,
                tool_calls=new_tool_calls,
                token_count=token_count,
                embedding=None,
                embedding_model="",
                embedding_attempts=0,
                embedding_error="",
                embedding_status=message_index_fields(tenant=tenant)["embedding_status"],
            )
            Session.objects.filter(pk=session.pk).update(
                token_count=max(0, session.token_count - message.token_count + token_count)
            )
            memory_index_dispatch_on_commit()
        counts["messages"] = int(changed)
        counts["embedding_cache"] = cache_entries_delete(tenant=tenant, hashes={old_hash}) if changed else 0
        if any(counts.values()):
            content_generation_bump(tenant=tenant)
        recorder.event_append(
            tenant=tenant,
            type=REDACTED_EVENT,
            session=session,
            payload={"seq": seq, "counts": counts, "tool_calls": bool(old_tool_calls)},
        )
    return RedactReceipt(session=session.public_id, seq=seq, counts=counts)


def _redact_copies(*, tenant: Tenant, session: Session, seq: int, parts: list[str]) -> dict[str, int]:
    """Delete or tombstone what was derived from or quotes the message (not the message itself)."""
    counts: dict[str, int] = {}
    summaries = Summary.objects.filter(session=session, covers_up_to_seq__gte=seq)
    counts["summaries"] = summaries.delete()[1].get(Summary._meta.label, 0)
    if counts["summaries"]:
        # The newest remaining summary (which never read the message) is the current one again.
        newest = Summary.objects.filter(session=session).order_by("-covers_up_to_seq", "-pk").first()
        if newest is not None:
            Summary.objects.filter(pk=newest.pk).update(is_current=True)
    digests = SessionDigest.objects.filter(session=session, covers_up_to_seq__gte=seq)
    counts["digests"] = digests.delete()[1].get(SessionDigest._meta.label, 0)
    if counts["digests"]:
        session_digest_queue(session=session)
    facts = TrackedFact.objects.filter(session=session, source_seq=seq)
    counts["tracked_facts"] = facts.delete()[1].get(TrackedFact._meta.label, 0)
    source = [{"session": session.public_id, "seq": seq}]
    memories = UserMemory.objects.filter(tenant=tenant, sources__contains=source)
    counts["user_memories"] = memories.delete()[1].get(UserMemory._meta.label, 0)
    quoted = like_any(_json_quotes(parts))
    counts["events"] = counts["context_builds"] = counts["stored_responses"] = 0
    if quoted:
        counts["events"] = events_tombstone(
            tenant=tenant, where="payload::text LIKE ANY(%s)", params=[quoted]
        )
        # A context build's manifest and a stored response may quote it, in any session it was recalled in.
        counts["context_builds"] = sql_execute(
            f"DELETE FROM {BudgetSample._meta.db_table} WHERE tenant_id = %s AND "
            "(manifest::text LIKE ANY(%s) OR components::text LIKE ANY(%s) OR warnings::text LIKE ANY(%s))",
            [tenant.pk, quoted, quoted, quoted],
        )
        counts["stored_responses"] = sql_execute(
            f"DELETE FROM {IdempotencyRecord._meta.db_table} WHERE tenant_id = %s "
            "AND response_body::text LIKE ANY(%s)",
            [tenant.pk, quoted],
        )
    return counts
