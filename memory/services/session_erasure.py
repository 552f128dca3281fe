"""What deleting a session takes with it, beyond the rows its cascades delete.

The session row's cascades take its messages (with their vectors), summaries, digests, tracked
facts, context builds, usage reports, OTel mappings and policy. `session_erase` takes, in the same
transaction, what was derived from the session and lives elsewhere, the same way forgetting a
user does (memory/services/forget.py):

- a user memory taken only from the session's turns is deleted (with its vector); one that other
  sessions' turns also said keeps its text and loses this session's sources;
- an experience whose every provenance entry names the session (distilled or promoted from it) is
  deleted; one with other provenance loses the entries naming the session;
- the session's events, and those naming an erased memory or experience, become tombstones
  (ids, no content); stored idempotent answers and queued job payloads naming the session or an
  erased row are deleted;
- the tenant's embedding-cache rows of the erased texts go, and its content generation moves on.

Tasks of the session stay (unlinked), as do the agent's state and checkpoints: they are the
agent's, not the session's.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from memory.models import (
    Experience,
    IdempotencyRecord,
    JobIntent,
    Message,
    OtelHeldSpan,
    OtelSpan,
    Session,
    SessionDigest,
    Tenant,
    UserMemory,
)
from memory.services.content_generation import content_generation_bump
from memory.services.embedding import text_hash
from memory.services.erasure import (
    cache_entries_delete,
    events_tombstone,
    like_any,
    message_text_hashes,
    sql_execute,
)


def _named(entries: Any, session_id: str) -> list[Any]:
    """The entries (sources or provenance) that do not name the session."""
    return [e for e in entries or [] if not (isinstance(e, dict) and e.get("session") == session_id)]


def _memories_erase(*, tenant: Tenant, session_id: str) -> tuple[list[UserMemory], int]:
    """Delete the memories taken from the session alone; trim the session from the others'
    sources. (the deleted rows, how many were trimmed)."""
    sourced = list(
        UserMemory.objects.select_for_update().filter(
            tenant=tenant, sources__contains=[{"session": session_id}]
        )
    )
    doomed = [memory for memory in sourced if not _named(memory.sources, session_id)]
    for memory in sourced:
        if memory not in doomed:
            memory.sources = _named(memory.sources, session_id)
            memory.save(update_fields=["sources"])
    UserMemory.objects.filter(pk__in=[m.pk for m in doomed]).delete()
    return doomed, len(sourced) - len(doomed)


def _experiences_erase(*, tenant: Tenant, session: Session) -> tuple[list[Experience], int]:
    """Delete the experiences derived from the session alone; trim it from the others' provenance."""
    linked = list(
        Experience.objects.select_for_update()
        .filter(tenant=tenant)
        .filter(Q(source_session=session) | Q(provenance__contains=[{"session": session.public_id}]))
        .only("pk", "public_id", "problem", "cause", "solution", "text_hash", "provenance")
    )
    doomed = [row for row in linked if not _named(row.provenance, session.public_id)]
    for row in linked:
        if row not in doomed:
            Experience.objects.filter(pk=row.pk).update(provenance=_named(row.provenance, session.public_id))
    Experience.objects.filter(pk__in=[row.pk for row in doomed]).delete()
    return doomed, len(linked) - len(doomed)


def session_erase(*, tenant: Tenant, session: Session) -> dict[str, int]:
    """Erase what was derived from `session` outside its own rows (module docstring); the caller
    then deletes the session row, in the same transaction. Counts per kind (ids, no content)."""
    sid = session.public_id
    hashes = message_text_hashes(Message.objects.filter(tenant=tenant, session=session))
    hashes |= {
        text_hash(t) for t in SessionDigest.objects.filter(session=session).values_list("text", flat=True)
    }
    memories, memories_trimmed = _memories_erase(tenant=tenant, session_id=sid)
    experiences, experiences_trimmed = _experiences_erase(tenant=tenant, session=session)
    hashes |= {text_hash(m.text) for m in memories}  # as embedded (not the memory's own text_hash)
    for row in experiences:
        hashes |= {row.text_hash, text_hash(row.problem_text)}
    erased = [m.public_id for m in memories] + [row.public_id for row in experiences]
    patterns = like_any([sid, *erased])
    counts = {
        "user_memories": len(memories),
        "user_memories_trimmed": memories_trimmed,
        "experiences": len(experiences),
        "experiences_trimmed": experiences_trimmed,
        "events": events_tombstone(
            tenant=tenant,
            where="session_id = %s OR payload::text LIKE ANY(%s)",
            params=[session.pk, patterns],
        ),
        "stored_responses": sql_execute(
            f"DELETE FROM {IdempotencyRecord._meta.db_table} "
            "WHERE tenant_id = %s AND response_body::text LIKE ANY(%s)",
            [tenant.pk, patterns],
        ),
        "jobs": sql_execute(
            f"DELETE FROM {JobIntent._meta.db_table} WHERE tenant_id = %s AND "
            "(payload::text LIKE ANY(%s) OR coalesce(result::text, '') LIKE ANY(%s))",
            [tenant.pk, patterns, patterns],
        ),
    }
    traces = OtelSpan.objects.filter(tenant=tenant, session=session).values("trace_id")
    counts["otel_held_spans"] = OtelHeldSpan.objects.filter(tenant=tenant, trace_id__in=traces).delete()[0]
    counts["embedding_cache"] = cache_entries_delete(tenant=tenant, hashes=hashes)
    content_generation_bump(tenant=tenant)
    return counts
