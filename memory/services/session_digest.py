"""Medium-term memory: each session's structured digest, maintained by the summarisation job.

A digest has seven categories — goals, decisions, findings, preferences, constraints, progress,
open questions — each a short list of items `{"text", "seq", "role"}` (seq: the message it came
from; None when the LLM wrote it). Each update that changes it is a new SessionDigest version
with a `digest.updated` event; the history is kept.

- Offline (default): extractive. Every sentence of the messages read since the last version is
  classified by cue words (the summariser's `_categorise` idea, with the seven categories): goals
  and preferences only from the user; a question is open until an assistant message follows it.
  Items merge into the previous version's (duplicates dropped, newest CTXAPP_DIGEST_MAX_ITEMS
  kept per category). Deterministic, no model.
- LLM: when CTXAPP_SUMMARISER_URL is set (and CTXAPP_DIGEST_LLM), the endpoint is asked for the
  whole updated digest as JSON. Malformed output is retried with a correction message up to
  CTXAPP_SUMMARISER_RETRIES times; then the offline extractor writes it (method `llm_fallback`,
  the errors kept).
- Use: `context_digest_for_session` is what context_build offers a new session of the same user
  that has no digest yet (the previous session's latest digest); `digests_search_candidates` finds
  digests by full text (for memory search, kind `summary`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.postgres.search import SearchQuery, SearchRank
from django.db import transaction
from django.db.models import Exists, F, OuterRef, QuerySet, Subquery

from memory.exceptions import NotFound
from memory.models import (
    DIGEST_CATEGORIES,
    DigestMethod,
    Message,
    MessageRole,
    Session,
    SessionDigest,
    Tenant,
)
from memory.services import jobs, recorder, sharing
from memory.services.chat_endpoint import chat_parsed
from memory.services.rolling_summary import MAX_SENTENCE_CHARS, _message_sentences

logger = logging.getLogger(__name__)

DIGEST_JOB = jobs.DIGEST  # its job kind; what it runs is registered by memory/tasks/jobs.py

HEADINGS = {
    "goals": "Goals",
    "decisions": "Decisions",
    "findings": "Findings",
    "preferences": "Preferences",
    "constraints": "Constraints",
    "progress": "Progress",
    "open_questions": "Open questions",
}
# Messages read per update (a longer backlog is read newest last; the rest is skipped, counted).
MAX_ROWS_PER_UPDATE = 2_000
LLM_TRANSCRIPT_CHARS = 40_000

_I = re.IGNORECASE
# Cue words per category; a sentence goes to the first category (in CLASSIFY_ORDER) that matches.
_CUES: dict[str, re.Pattern[str]] = {
    "preferences": re.compile(
        r"\b(i|we) (really )?(prefer|like|love|hate|dislike|enjoy)\b|\bprefer(s|red|ence)?\b|"
        r"\b(i'd|i would|we'd) rather\b|\bfavou?rite\b|\b(don't|do not) like\b|\binstead of\b",
        _I,
    ),
    "constraints": re.compile(
        r"\b(must|must not|mustn't|never|cannot|can't|not allowed|forbidden|required|requires|"
        r"at most|at least|no more than|no later than|deadline|budget|limit(ed)?|has to|have to|"
        r"only (use|run|on)|without)\b",
        _I,
    ),
    "decisions": re.compile(
        r"\b(decided|decide|decision|we will|we'll|let's go with|going with|go with|chose|choose|"
        r"agreed|settled on|switch(ed)? to|plan is|we'?re going to use|opted)\b",
        _I,
    ),
    "goals": re.compile(
        r"\b(goal|objective|aim|want to|wants to|need to|needs to|trying to|try to|would like to|"
        r"i'd like to|looking to|plan to|hoping to|help me|so that|working on)\b",
        _I,
    ),
    "findings": re.compile(
        r"\b(found|turns out|turned out|discovered|noticed|realis(ed|ized)|realized|root cause|"
        r"caused by|because|the (issue|problem|cause|bug) (is|was)|it seems|appears to|showed|shows|"
        r"confirmed|measured|benchmark|result(s)? (is|are|was|were))\b",
        _I,
    ),
    "progress": re.compile(
        r"\b(done|finished|completed|implemented|deployed|shipped|merged|works now|now works|"
        r"fixed|set up|migrated|passed|passing|milestone|so far|next step|is ready|are ready)\b",
        _I,
    ),
    "open_questions": re.compile(
        r"\b(not sure|unsure|unclear|open question|to be decided|tbd|todo|still need to figure|"
        r"don't know yet|no idea yet)\b",
        _I,
    ),
}
CLASSIFY_ORDER = (
    "preferences",
    "constraints",
    "decisions",
    "goals",
    "findings",
    "progress",
    "open_questions",
)
USER_ONLY = {"goals", "preferences"}
_SPACE = re.compile(r"\W+")


class DigestModelFailed(Exception):
    """The chat endpoint failed or kept answering with something that is not a digest."""


def digest_categorise(text: str, *, role: str) -> str | None:
    """The digest category of one sentence, or None (small talk). Deterministic."""
    for category in CLASSIFY_ORDER:
        if category in USER_ONLY and role != MessageRole.USER:
            continue
        if _CUES[category].search(text):
            return category
    if text.rstrip().endswith("?") and role == MessageRole.USER:
        return "open_questions"
    return None


def _key(text: str) -> str:
    return _SPACE.sub(" ", text.lower()).strip()


def _empty() -> dict[str, list[dict[str, Any]]]:
    return {category: [] for category in DIGEST_CATEGORIES}


def offline_digest(
    *, previous: dict[str, list[dict[str, Any]]] | None, rows: list[dict[str, Any]], max_items: int
) -> dict[str, list[dict[str, Any]]]:
    """The digest after reading `rows` (message dicts: seq, role, content, tool_calls), extractively.

    Previous items are kept; new ones are appended (duplicates by normalised text dropped); a
    question is dropped once an assistant message follows it; the newest `max_items` per category
    are kept.
    """
    content = _empty()
    for category in DIGEST_CATEGORIES:
        content[category] = [dict(item) for item in (previous or {}).get(category, [])]
    last_assistant_seq = max(
        (r["seq"] for r in rows if r["role"] == MessageRole.ASSISTANT and (r.get("content") or "").strip()),
        default=None,
    )
    for row in rows:
        if row["role"] not in (MessageRole.USER, MessageRole.ASSISTANT):
            continue  # system prompts and tool output are not what the session is about
        for sentence in _message_sentences(row):
            text = sentence.strip()
            if len(text) < 8:
                continue
            if len(text) > MAX_SENTENCE_CHARS:
                text = text[: MAX_SENTENCE_CHARS - 1] + "…"
            found = digest_categorise(text, role=row["role"])
            if found is None:
                continue
            category = found
            item = {"text": text, "seq": row["seq"], "role": row["role"]}
            if category == "open_questions" and text.endswith("?"):
                item["question"] = True
            content[category].append(item)
    # a question an assistant message came after is answered (or at least taken up)
    if last_assistant_seq is not None:
        content["open_questions"] = [
            item
            for item in content["open_questions"]
            if not (item.get("question") and (item.get("seq") or 0) < last_assistant_seq)
        ]
    for category in DIGEST_CATEGORIES:
        seen: dict[str, dict[str, Any]] = {}
        for item in content[category]:
            seen.pop(_key(item["text"]), None)  # a repeat moves to its newest position
            seen[_key(item["text"])] = item
        content[category] = list(seen.values())[-max_items:]
    return content


def digest_text(content: dict[str, list[dict[str, Any]]]) -> str:
    """The digest as text: one heading per non-empty category, one line per item."""
    sections = []
    for category in DIGEST_CATEGORIES:
        items = content.get(category) or []
        if items:
            sections.append(f"{HEADINGS[category]}:\n" + "\n".join(f"- {item['text']}" for item in items))
    return "\n".join(sections)


# --- LLM --------------------------------------------------------------------------------------


SYSTEM_PROMPT = (
    "You maintain the digest of a conversation between a user and an AI agent: what a later "
    "session needs to know. Update the previous digest with the new messages and reply with ONE "
    "JSON object only, with exactly these keys, each a list of short strings (at most {max_items} "
    "each, newest last): " + ", ".join(f'"{c}"' for c in DIGEST_CATEGORIES) + ". goals: what the "
    "user wants to achieve; decisions: what was decided; findings: facts discovered; preferences: "
    "the user's likes and ways of working; constraints: limits and requirements; progress: what "
    "is done; open_questions: what is still unanswered. Drop small talk."
)


def parse_digest_output(text: str, *, max_items: int) -> dict[str, list[dict[str, Any]]]:
    """The digest in the model's reply. Tolerates code fences and prose around one JSON object.

    Raises ValueError naming what is wrong: no JSON object, invalid JSON, an unknown key, a value
    that is not a list of strings.
    """
    cleaned = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    start, end = cleaned.find("{"), cleaned.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the reply")
    try:
        data = json.loads(cleaned[start : end + 1])
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("the reply is not a JSON object")
    unknown = sorted(set(data) - set(DIGEST_CATEGORIES))
    if unknown:
        raise ValueError(f"unknown key(s): {', '.join(unknown)}")
    if not set(data) & set(DIGEST_CATEGORIES):
        raise ValueError("none of the digest keys")
    content = _empty()
    for category in DIGEST_CATEGORIES:
        value = data.get(category, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f'"{category}" is not a list of strings')
        items = [v.strip()[:MAX_SENTENCE_CHARS] for v in value if v.strip()]
        content[category] = [{"text": v, "seq": None, "role": "llm"} for v in items[-max_items:]]
    return content


def llm_digest(
    *, previous: dict[str, list[dict[str, Any]]] | None, rows: list[dict[str, Any]], max_items: int
) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Ask the summariser's chat endpoint for the updated digest: (content, errors of earlier tries).

    Raises DigestModelFailed after 1 + CTXAPP_SUMMARISER_RETRIES unusable answers.
    """
    transcript = "\n".join(
        f"[#{r['seq']} {r['role']}] " + " ".join(_message_sentences(r))
        for r in rows
        if r["role"] in (MessageRole.USER, MessageRole.ASSISTANT)
    )[-LLM_TRANSCRIPT_CHARS:]
    previous_json = json.dumps(
        {c: [i["text"] for i in (previous or {}).get(c, [])] for c in DIGEST_CATEGORIES}, ensure_ascii=False
    )
    chat: list[dict[str, str]] = [
        {"role": "system", "content": SYSTEM_PROMPT.replace("{max_items}", str(max_items))},
        {"role": "user", "content": f"Previous digest:\n{previous_json}\n\nNew messages:\n{transcript}"},
    ]
    content, errors = chat_parsed(chat, lambda reply: parse_digest_output(reply, max_items=max_items))
    if content is not None:
        return content, errors
    logger.warning("session digest: the chat endpoint failed, offline extractor used: %s", errors)
    raise DigestModelFailed("; ".join(errors)[:500])


# --- the job ----------------------------------------------------------------------------------


def session_digest_update(*, tenant: Tenant, session: Session) -> SessionDigest | None:
    """Bring the session's digest up to its newest message: a new version, or None if nothing new.

    Reads the messages after the latest version's `covers_up_to_seq` (at most MAX_ROWS_PER_UPDATE;
    with more, the next job is queued after commit); writes version n + 1 (with a
    `digest.updated` event) only when the digest changed — otherwise it moves nothing and returns
    None (idempotent: a second run right after the first writes nothing). Never raises for a
    failing chat endpoint (falls back to offline, method `llm_fallback`, error kept). Concurrent
    runs are serialised on the session row; the loser writes nothing.
    """
    latest = SessionDigest.objects.filter(tenant=tenant, session=session).order_by("-version").first()
    covered = latest.covers_up_to_seq if latest else 0
    rows: list[dict[str, Any]] = [
        dict(row)
        for row in Message.objects.filter(session=session, seq__gt=covered)
        .order_by("seq")
        .values("seq", "role", "content", "tool_calls")[:MAX_ROWS_PER_UPDATE]
    ]
    if not rows:
        return None
    max_items = settings.CTXAPP.digest_max_items
    previous = latest.content if latest else None
    method, error = DigestMethod.OFFLINE, ""
    conf = settings.CTXAPP
    if conf.summariser_url and conf.digest_llm:
        try:
            content, _ = llm_digest(previous=previous, rows=rows, max_items=max_items)
            method = DigestMethod.LLM
        except DigestModelFailed as exc:
            method, error = DigestMethod.LLM_FALLBACK, str(exc)[:500]
            content = offline_digest(previous=previous, rows=rows, max_items=max_items)
    else:
        content = offline_digest(previous=previous, rows=rows, max_items=max_items)
    covers = rows[-1]["seq"]
    text = digest_text(content)
    with transaction.atomic():
        Session.objects.select_for_update(no_key=True).filter(
            pk=session.pk
        ).first()  # serialise concurrent runs
        now_latest = SessionDigest.objects.filter(session=session).order_by("-version").first()
        if (now_latest.pk if now_latest else None) != (latest.pk if latest else None):
            return None  # another run wrote a version meanwhile
        if len(rows) == MAX_ROWS_PER_UPDATE:
            session_digest_queue(session=session)  # a long backlog: the next job reads on
        if latest is not None and text == latest.text:
            # nothing new worth keeping: remember how far we read, without a new version
            SessionDigest.objects.filter(pk=latest.pk).update(covers_up_to_seq=covers)
            return None
        digest = SessionDigest.objects.create(
            tenant=tenant,
            session=session,
            user_id=session.user_id,
            version=(latest.version + 1) if latest else 1,
            content=content,
            text=text,
            covers_up_to_seq=covers,
            method=method,
            error=error,
        )
        counts = {c: len(content.get(c, [])) for c in DIGEST_CATEGORIES}
        payload = {"version": digest.version, "covers_up_to_seq": covers, "method": method, "counts": counts}
        recorder.event_append(
            tenant=tenant,
            type="digest.updated",
            session=session,
            payload={**payload, **({"error": error} if error else {})},
        )
    return digest


def session_digest_queue(*, session: Session) -> None:
    """Queue a digest update of `session`: a job record in the caller's transaction, dispatched
    after commit (memory/services/jobs.py). Its outcome is recorded on the record, like every job's.

    Coalesces with an update of the same session not taken yet. A broker that is down is never
    raised: the sweep dispatches the job again.
    """
    with transaction.atomic():
        jobs.job_enqueue(
            tenant=session.tenant,
            kind=DIGEST_JOB,
            key=f"session:{session.pk}",
            payload={"session": session.pk},
        )


# --- reads ------------------------------------------------------------------------------------


def session_digest_get(*, tenant: Tenant, session: Session, version: int | None = None) -> SessionDigest:
    """The session's latest digest, or the given version. Raises NotFound (also for another tenant's)."""
    queryset = SessionDigest.objects.filter(tenant=tenant, session=session)
    digest = (
        queryset.filter(version=version).first()
        if version is not None
        else queryset.order_by("-version").first()
    )
    if digest is None:
        what = f"version {version}" if version is not None else "digest"
        raise NotFound(
            f"Session {session.public_id} has no {what} yet.",
            details={"kind": "digest", "session": session.public_id, "version": version},
        )
    return digest


def session_digests_list(*, tenant: Tenant, session: Session) -> QuerySet[SessionDigest]:
    """The session's digest versions (the caller orders / pages). Read-only."""
    return SessionDigest.objects.filter(tenant=tenant, session=session)


@dataclass(frozen=True)
class OfferedDigest:
    digest: SessionDigest
    session_id: str  # public id of the session it summarises
    agent: str = ""  # external id of that session's agent (the manifest says where it came from)


def context_digest_for_session(*, tenant: Tenant, session: Session) -> OfferedDigest | None:
    """The digest a context build of `session` is offered: the latest digest of the same user's
    most recent OTHER session of the same agent (of any agent when the tenant's sharing policy
    shares digests, memory/services/sharing.py), when `session` has no digest of its own yet.
    Read-only.

    None when the session has no user id (nothing says whose memory it is), already has a digest,
    or the user has no earlier digest with this agent. Never another user's, never another
    tenant's, never another agent's unless shared: a digest holds text the user wrote to that
    agent, and one agent's conversation must not steer another (docs/reliability.md).
    """
    if not session.user_id:
        return None
    # One statement: none offered when the session has a digest of its own.
    digest = (
        SessionDigest.objects.filter(
            ~Exists(SessionDigest.objects.filter(session=session)),
            tenant=tenant,
            user_id=session.user_id,
            session__created_at__lte=session.created_at,
        )
        .filter(sharing.digest_reader_filter(tenant=tenant, session=session))
        .exclude(session=session)
        .select_related("session__agent")
        .order_by("-session__created_at", "-version")
        .first()
    )
    if digest is None:
        return None
    return OfferedDigest(
        digest=digest, session_id=digest.session.public_id, agent=digest.session.agent.external_id
    )


def digests_search_candidates(
    *, tenant: Tenant, query: str, user_id: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    """Latest digest versions of `tenant` (of `user_id` when given) matching `query` by full text.

    For memory search (kind `summary`): each hit is {"session", "version", "text", "rank",
    "created_at", "user_id"}, best first. An OR query over the query's English lexemes, like
    experience search. Read-only.
    """
    words = re.findall(r"\w+", query)
    if not words:
        return []
    latest_version = (
        SessionDigest.objects.filter(session=OuterRef("session")).order_by("-version").values("version")[:1]
    )
    tsquery = SearchQuery(" | ".join(words), search_type="raw", config="english")
    queryset = SessionDigest.objects.filter(tenant=tenant, version=Subquery(latest_version)).filter(
        search_vector=tsquery
    )
    if user_id is not None:
        queryset = queryset.filter(user_id=user_id)
    rows = (
        queryset.annotate(
            rank=SearchRank(F("search_vector"), tsquery), session_public_id=F("session__public_id")
        )
        .order_by("-rank", "-created_at")
        .values("session_public_id", "version", "text", "rank", "created_at", "user_id")[:limit]
    )
    return [
        {
            "session": row["session_public_id"],
            "version": row["version"],
            "text": row["text"],
            "rank": float(row["rank"]),
            "created_at": row["created_at"],
            "user_id": row["user_id"],
        }
        for row in rows
    ]
