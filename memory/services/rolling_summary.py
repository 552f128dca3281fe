"""Rolling session summaries: fold messages older than the kept tail into one current Summary.

The default summariser runs offline and is extractive: it keeps the sentences that carry
decisions, errors, constraints, numbers and names (priorities: decision 100, error 90,
constraint 85, code 70, fact 60, conversation 50; +20 recent, +30 marked important), within the
policy's summary budget, and carries the previous summary's lines forward. An OpenAI-compatible
chat endpoint can write the summary instead (CTXAPP_SUMMARISER_URL); on any failure after its
retries the offline summariser writes it (method `llm_fallback`, the error kept).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.db import transaction

from memory.models import Message, MessageRole, Session, Summary, SummaryMethod, Tenant
from memory.services import decay, jobs, recorder, tokens
from memory.services.context_history import history_groups
from memory.services.context_policy import context_policy_effective

logger = logging.getLogger(__name__)

CATEGORIES = ("decision", "error", "constraint", "code", "fact", "conversation")
HEADINGS = {
    "decision": "Decisions",
    "error": "Errors",
    "constraint": "Constraints",
    "code": "Code",
    "fact": "Key facts",
    "conversation": "Conversation",
}
PRIORITY = {"decision": 100, "error": 90, "constraint": 85, "code": 70, "fact": 60, "conversation": 50}
_PATTERNS = {
    "decision": re.compile(
        r"\b(decided|decide|decision|we will|we'll|i will|i'll|going with|go with|chose|choose|agreed|"
        r"switch(ed)? to|plan is|resolved|fixed by|solution|conclusion)\b|决定|采用|決定",
        re.IGNORECASE,
    ),
    "error": re.compile(
        r"\b(error|exception|failed|fails|failure|traceback|bug|crash(ed)?|time(d)? ?out|refused|denied|"
        r"invalid|"
        r"cannot|can't|not found|broken|panic|fatal)\b|错误|失败|エラー",
        re.IGNORECASE,
    ),
    "constraint": re.compile(
        r"\b(must|never|always|required|requires|only|do not|don't|should not|shouldn't|at most|at least|"
        r"limit|deadline|no more than|prefer|preference)\b|必须|不要|禁止",
        re.IGNORECASE,
    ),
    "code": re.compile(r"`[^`]+`|\w+\(\)|\w+\.\w+\(|^\s*(def|class|import|SELECT|CREATE)\b", re.IGNORECASE),
}
_NUMBER = re.compile(r"\d")
_NAME = re.compile(r"\b[A-Z][a-z]+[A-Z]\w*|\b[A-Z]{2,}\b|\b\w+[_/.]\w+|https?://\S+|\b[A-Z][a-z]{2,}\b")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+")  # noqa: RUF001
_LINE = re.compile(r"^- \[#(\d+) (\w+)\] (.*)$")
MAX_SENTENCE_CHARS = 300
LLM_TRANSCRIPT_CHARS = 60_000
MAX_FOLD_PER_JOB = 2_000


class SummariserFailed(Exception):
    """The summariser endpoint failed or answered with something unusable."""


@dataclass
class _Candidate:
    category: str
    seq: int
    role: str
    text: str
    score: float


def _categorise(text: str) -> str:
    for category in ("decision", "error", "constraint", "code"):
        if _PATTERNS[category].search(text):
            return category
    if _NUMBER.search(text) or _NAME.search(text):
        return "fact"
    return "conversation"


def _message_sentences(row: dict[str, Any]) -> list[str]:
    if row["role"] == MessageRole.ASSISTANT and row["tool_calls"]:
        calls = []
        for call in row["tool_calls"]:
            function = (call or {}).get("function") or {}
            calls.append(f"{function.get('name', 'tool')}({str(function.get('arguments', ''))[:120]})")
        prefix = [row["content"]] if row["content"] else []
        return [*prefix, "called " + ", ".join(calls)]
    text = row["content"] or ""
    if row["role"] == MessageRole.TOOL:
        first = text.strip().splitlines()[0] if text.strip() else "(empty)"
        return [f"tool result: {first}"]
    sentences: list[str] = []
    for line in text.splitlines():
        sentences.extend(s.strip() for s in _SENTENCE.split(line) if s.strip())
    return sentences


def offline_summary(*, previous: str, rows: list[dict[str, Any]], max_tokens: int) -> str:
    """Extractive summary of `previous` + `rows` within `max_tokens` (o200k). Deterministic."""
    candidates: list[_Candidate] = []
    for line in previous.splitlines():
        match = _LINE.match(line.strip())
        if match:
            text = match.group(3)
            category = _categorise(text)
            candidates.append(
                _Candidate(category, int(match.group(1)), match.group(2), text, PRIORITY[category])
            )
    recent_from = rows[int(len(rows) * 0.8)]["seq"] if rows else 0
    for row in rows:
        important = bool(
            (row.get("metadata") or {}).get("critical") or (row.get("metadata") or {}).get("important")
        )
        for sentence in _message_sentences(row):
            text = (
                sentence if len(sentence) <= MAX_SENTENCE_CHARS else sentence[: MAX_SENTENCE_CHARS - 1] + "…"
            )
            category = _categorise(text)
            score = PRIORITY[category] + (20 if row["seq"] >= recent_from else 0) + (30 if important else 0)
            score += 5 if _NUMBER.search(text) else 0
            score += 5 if _NAME.search(text) else 0
            candidates.append(_Candidate(category, row["seq"], row["role"], text, score))
    seen: set[str] = set()
    unique = []
    for candidate in candidates:
        key = re.sub(r"\W+", " ", candidate.text.lower()).strip()
        if key and key not in seen:
            seen.add(key)
            unique.append(candidate)
    chosen: list[_Candidate] = []
    used = 0
    for candidate in sorted(unique, key=lambda c: (-c.score, -c.seq)):
        cost = tokens.count_tokens(candidate.text) + 8
        if used + cost > max_tokens:
            continue
        chosen.append(candidate)
        used += cost
    sections = []
    for category in CATEGORIES:
        lines = [
            f"- [#{c.seq} {c.role}] {c.text}"
            for c in sorted(chosen, key=lambda c: c.seq)
            if c.category == category
        ]
        if lines:
            sections.append(f"{HEADINGS[category]}:\n" + "\n".join(lines))
    return "\n".join(sections) if sections else "(nothing worth keeping)"


def _transcript(rows: list[dict[str, Any]]) -> str:
    return "\n".join(f"[#{r['seq']} {r['role']}] " + " ".join(_message_sentences(r)) for r in rows)


def llm_summary(*, previous: str, rows: list[dict[str, Any]], max_tokens: int) -> str:
    """Ask the configured OpenAI-compatible endpoint for the summary. Raises SummariserFailed."""
    conf = settings.CTXAPP
    transcript = _transcript(rows)
    if len(transcript) > LLM_TRANSCRIPT_CHARS:  # too long to send: send the extract instead
        transcript = offline_summary(previous="", rows=rows, max_tokens=max_tokens * 4)
    body = {
        "model": conf.summariser_model,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [
            {
                "role": "system",
                "content": (
                    "You maintain the rolling summary of an agent's conversation. Merge the previous summary "
                    "and the new messages into one summary. Keep every decision, error, constraint, number "
                    "and "
                    "name; drop small talk. Plain text, at most "
                    f"{max_tokens} tokens."
                ),
            },
            {
                "role": "user",
                "content": f"Previous summary:\n{previous or '(none)'}\n\nNew messages:\n{transcript}",
            },
        ],
    }
    headers = {"Authorization": f"Bearer {conf.summariser_api_key}"} if conf.summariser_api_key else {}
    url = conf.summariser_url.rstrip("/") + "/chat/completions"
    last_error = "no attempt"
    for _ in range(1 + max(0, conf.summariser_retries)):
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=conf.summariser_timeout)
            response.raise_for_status()
            text = response.json()["choices"][0]["message"]["content"]
            if not isinstance(text, str) or not text.strip():
                raise ValueError("empty summary")
            if tokens.count_tokens(text) > max_tokens * 2:
                raise ValueError("summary longer than twice the budget")
            return text.strip()
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"[:400]
            logger.warning("summariser endpoint failed: %s", last_error)
    raise SummariserFailed(last_error)


def _fold_rows(*, session: Session, covered: int, fold_to: int) -> list[dict[str, Any]]:
    """Rows (covered, fold_to], with fold_to moved back so no tool-call group is split."""
    fields = ("seq", "role", "content", "tool_calls", "tool_call_id", "metadata", "token_count")
    rows = list(
        Message.objects.filter(session=session, seq__gt=covered, seq__lte=fold_to)
        .order_by("seq")
        .values(*fields)
    )
    following = list(
        Message.objects.filter(session=session, seq__gt=fold_to).order_by("seq").values(*fields)[:64]
    )
    tail = rows[-64:]
    groups, _ = history_groups(tail + following)
    for group in groups:
        if group[0]["seq"] <= fold_to < group[-1]["seq"]:
            fold_to = group[0]["seq"] - 1
    return [r for r in rows if r["seq"] <= fold_to]


def session_summarise(*, tenant: Tenant, session: Session) -> Summary | None:
    """Fold the session's messages older than the kept tail into a new current Summary.

    Idempotent: when nothing new is older than the tail (or another run folded it meanwhile),
    returns None and writes nothing. Records `summary.created` with tokens before/after and the
    folded seqs, and calls decay.facts_after_summary, in the same transaction. Never raises for a
    failing summariser endpoint (falls back to offline). Folds at most MAX_FOLD_PER_JOB messages
    per call and, when more remain, queues the next job after commit.
    """
    session.refresh_from_db(fields=["message_seq", "status"])
    policy = context_policy_effective(tenant=tenant, session=session)
    current = Summary.objects.filter(session=session, is_current=True).first()
    covered = current.covers_up_to_seq if current else 0
    tail_start = session.message_seq - policy.keep_verbatim
    if tail_start <= covered:
        return None
    # bounded work per job: a long backlog is folded MAX_FOLD_PER_JOB messages at a time, each
    # job queueing the next after it commits
    fold_to = min(tail_start, covered + MAX_FOLD_PER_JOB)
    rows = _fold_rows(session=session, covered=covered, fold_to=fold_to)
    if not rows:
        return None
    previous = current.text if current else ""
    method, error = SummaryMethod.OFFLINE, ""
    if settings.CTXAPP.summariser_url:
        try:
            text = llm_summary(previous=previous, rows=rows, max_tokens=policy.summary_max_tokens)
            method = SummaryMethod.LLM
        except SummariserFailed as exc:
            method, error = SummaryMethod.LLM_FALLBACK, str(exc)
            text = offline_summary(previous=previous, rows=rows, max_tokens=policy.summary_max_tokens)
    else:
        text = offline_summary(previous=previous, rows=rows, max_tokens=policy.summary_max_tokens)
    tokens_before = (current.tokens if current else 0) + sum(r["token_count"] for r in rows)
    tokens_after = tokens.count_tokens(text)
    folded_seqs = [r["seq"] for r in rows]

    with transaction.atomic():
        Session.objects.select_for_update(no_key=True).filter(
            pk=session.pk
        ).first()  # serialise concurrent runs
        latest = Summary.objects.filter(session=session, is_current=True).first()
        if (latest.pk if latest else None) != (current.pk if current else None):
            return None  # another run folded these meanwhile
        if latest is not None:
            latest.is_current = False
            latest.save(update_fields=["is_current"])
        summary = Summary.objects.create(
            tenant=tenant,
            session=session,
            previous=current,
            text=text,
            tokens=tokens_after,
            covers_up_to_seq=folded_seqs[-1],
            folded_from_seq=folded_seqs[0],
            folded_to_seq=folded_seqs[-1],
            folded_count=len(folded_seqs),
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            method=method,
            error=error,
        )
        alerts = decay.facts_after_summary(
            tenant=tenant, session=session, summary_text=text, folded_seqs=folded_seqs
        )
        recorder.event_append(
            tenant=tenant,
            type="summary.created",
            session=session,
            payload={
                "summary_id": summary.public_id,
                "covers_up_to_seq": summary.covers_up_to_seq,
                "folded_from_seq": summary.folded_from_seq,
                "folded_to_seq": summary.folded_to_seq,
                "folded_count": summary.folded_count,
                "tokens_before": tokens_before,
                "tokens_after": tokens_after,
                "method": method,
                "alerts": list(alerts or []),
            },
        )
    if summary.covers_up_to_seq < tail_start and fold_to < tail_start:
        jobs.job_enqueue(
            tenant=tenant, kind=jobs.SUMMARISE, key=f"session:{session.pk}", payload={"session": session.pk}
        )
    return summary


def summaries_list(*, tenant: Tenant, session: Session, limit: int = 20) -> list[Summary]:
    """The session's summaries, newest first (the current one first). Read-only."""
    return list(
        Summary.objects.filter(tenant=tenant, session=session).order_by("-covers_up_to_seq", "-pk")[:limit]
    )
