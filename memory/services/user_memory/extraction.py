"""Extracting memories about a user from the turns of their sessions.

An append that holds a user turn queues one `user_memory.extract` job for its session
(`extraction_queue`, a job record in the append's transaction, coalesced per session: a burst of
appends queues one run). The run (`session_memories_extract`) reads the turns after the session's
watermark, at most BATCH_TURNS of them, extracts candidate memories and records each one through
`memory_record`, the one write path, at the time the turn was said: a newer value of a subject
supersedes the older one, a repeat only adds its source, and a statement older than the current
value is dropped (Conflict). The watermark advances in the same transaction, so a retried run
never records a turn twice.

Two extractors, one contract (a list of `Candidate`):
- offline (default, no model): patterns over the USER's own sentences (`offline_candidates`).
  Assistant turns are never read as facts about the user; acknowledgements and small talk match
  no pattern, and questions only count for a statement made in the same sentence.
- the configured chat endpoint (CTXAPP_SUMMARISER_*, when its URL is set): ONE call per
  batch of turns, never per turn. The reply must be a JSON object of memories whose subjects,
  types, turn numbers and texts pass `parse_model_output`; a malformed reply is shown back to the
  model once per retry, and a batch the endpoint cannot answer is extracted offline instead.

What the offline rules will not extract is listed in docs/memory.md ("Extraction").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from memory.exceptions import Conflict
from memory.models import (
    Message,
    MessageRole,
    Session,
    Tenant,
    UserMemoryExtraction,
    UserMemoryOrigin,
    UserMemoryType,
)
from memory.services import jobs
from memory.services.chat_endpoint import chat_parsed
from memory.services.user_memory.rules import (
    MAX_MEMORY_CHARS,
    Candidate,
    Turn,
    is_small_talk,
    offline_candidates,
)
from memory.services.user_memory.store import memories_of, memory_record

__all__ = ["Candidate", "Turn", "is_small_talk", "offline_candidates"]

EXTRACT_JOB = jobs.USER_MEMORY_EXTRACT
BATCH_TURNS = 200  # turns read per run; a longer backlog queues the next run
_SUBJECT = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+){0,3}$")


# --- the model extractor -----------------------------------------------------------------------

_PROMPT = """You extract durable memories about the USER from a conversation between a user and an assistant.
Return ONLY a JSON object:
{"memories": [{"subject": ..., "type": ..., "text": ..., "turn": ..., "confidence": ...}]}.
- subject: a dotted lowercase key naming what the memory is about, so that a later value replaces an
  earlier one: home.city, work.employer, work.role, family.sister.name, partner.name,
  relationship.status, pet.dog.name, diet, constraint.allergy, preference.<topic>, plan.<topic>,
  decision.<topic>, fact.<topic>. Reuse a subject from "Known" when the value changed.
- type: one of profile, preference, decision, constraint, plan, fact.
- text: one short sentence about the user, with the value (e.g. "Lives in Denver").
- turn: the number of the USER turn that says it.
- confidence: 0 to 1.
Only what the user says about themself, or an assistant suggestion the user explicitly accepts.
Never small talk, thanks, acknowledgements, greetings or questions. No memory: {"memories": []}."""


def parse_model_output(reply: str, *, user_seqs: set[int]) -> list[Candidate]:
    """The model's reply as candidates. Raises ValueError naming the first thing wrong."""
    text = reply.strip()
    if text.startswith("```"):
        text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("memories"), list):
        raise ValueError('expected an object with a "memories" list')
    out = []
    for index, item in enumerate(data["memories"]):
        if not isinstance(item, dict):
            raise ValueError(f"memories[{index}] is not an object")
        subject = str(item.get("subject") or "").strip().casefold()
        memory_type = str(item.get("type") or "").strip().casefold()
        body = " ".join(str(item.get("text") or "").split())
        turn, confidence = item.get("turn"), item.get("confidence", 0.7)
        if not _SUBJECT.match(subject):
            raise ValueError(f"memories[{index}].subject {subject!r} is not a dotted lowercase key")
        if memory_type not in UserMemoryType.values:
            raise ValueError(f"memories[{index}].type must be one of {', '.join(UserMemoryType.values)}")
        if not body or len(body) > MAX_MEMORY_CHARS:
            raise ValueError(f"memories[{index}].text must be 1 to {MAX_MEMORY_CHARS} characters")
        if not isinstance(turn, int) or isinstance(turn, bool) or turn not in user_seqs:
            raise ValueError(f"memories[{index}].turn must be the number of a user turn")
        if (
            not isinstance(confidence, int | float)
            or isinstance(confidence, bool)
            or not 0 <= confidence <= 1
        ):
            raise ValueError(f"memories[{index}].confidence must be a number from 0 to 1")
        if is_small_talk(body):
            continue
        out.append(Candidate(subject, body, memory_type, turn, float(confidence)))
    return out


def model_candidates(
    turns: list[Turn], *, current: dict[str, str]
) -> tuple[list[Candidate] | None, list[str]]:
    """One chat call for the whole batch: (candidates, errors); None when no reply was usable."""
    user_seqs = {t.seq for t in turns if t.role == MessageRole.USER}
    known = "\n".join(f"- {s}: {t}" for s, t in sorted(current.items())) or "(none)"
    lines = "\n".join(
        f"[{t.seq} {t.role}] {t.text}" for t in turns if t.role in (MessageRole.USER, MessageRole.ASSISTANT)
    )
    chat = [
        {"role": "system", "content": _PROMPT},
        {"role": "user", "content": f"Known:\n{known}\n\nConversation:\n{lines}"},
    ]
    return chat_parsed(chat, lambda reply: parse_model_output(reply, user_seqs=user_seqs))


def model_configured() -> bool:
    return bool(settings.CTXAPP.summariser_url)


# --- the job ---------------------------------------------------------------------------------


def extraction_queue(*, tenant: Tenant, session: Session) -> None:
    """Queue extraction of `session`'s new turns, in the caller's transaction (coalesced per
    session: while one is queued and not taken, this writes nothing). A session without a user
    has nobody to remember things about: nothing is queued."""
    if not session.user_id:
        return
    jobs.job_enqueue(
        tenant=tenant, kind=EXTRACT_JOB, key=f"session:{session.pk}", payload={"session": session.pk}
    )


@dataclass(frozen=True)
class ExtractionResult:
    turns: int
    covers_up_to_seq: int
    method: str  # "offline" | "model" | "model_fallback" | "none"
    recorded: dict[str, int]
    errors: list[str]
    more: bool


def session_memories_extract(*, session: Session, batch: int = BATCH_TURNS) -> ExtractionResult:
    """Extract and record the memories of the session's turns after its watermark (one batch).

    Runs inside the caller's transaction (the job runner's): the memories and the watermark are
    written together or not at all. Queues the next batch when more turns are waiting.
    """
    tenant = session.tenant
    with transaction.atomic():
        state, _ = UserMemoryExtraction.objects.select_for_update().get_or_create(
            session=session, defaults={"tenant": tenant}
        )
        rows = list(
            Message.objects.filter(session=session, seq__gt=state.covers_up_to_seq)
            .order_by("seq")
            .values_list("seq", "role", "content", "occurred_at")[: batch + 1]
        )
        more = len(rows) > batch
        rows = rows[:batch]
        if not rows:
            return ExtractionResult(0, state.covers_up_to_seq, "none", {}, [], False)
        turns = [Turn(seq, role, content, at) for seq, role, content, at in rows]
        at_of = {t.seq: t.at for t in turns}
        current = {m.subject: m.text for m in memories_of(tenant=tenant, user_id=session.user_id)}
        method, errors = "offline", list[str]()
        candidates: list[Candidate] | None = None
        if model_configured() and any(t.role == MessageRole.USER for t in turns):
            candidates, errors = model_candidates(turns, current=current)
            method = "model" if candidates is not None else "model_fallback"
        if candidates is None:
            candidates = offline_candidates(turns, current=current)
        origin = UserMemoryOrigin.MODEL if method == "model" else UserMemoryOrigin.EXTRACTED
        recorded: dict[str, int] = {}
        for candidate in candidates:
            try:
                outcome = memory_record(
                    tenant=tenant,
                    user_id=session.user_id,
                    subject=candidate.subject,
                    text=candidate.text,
                    memory_type=candidate.memory_type,
                    sources=[{"session": session.public_id, "seq": candidate.seq}],
                    confidence=candidate.confidence,
                    origin=origin,
                    agent=session.agent.external_id,
                    at=at_of.get(candidate.seq),
                ).outcome
            except Conflict:
                outcome = "older"  # a newer value of the subject is already current
            recorded[outcome] = recorded.get(outcome, 0) + 1
        state.covers_up_to_seq = turns[-1].seq
        state.method = method
        state.save(update_fields=["covers_up_to_seq", "method", "updated_at"])
        if more:
            extraction_queue(tenant=tenant, session=session)
    return ExtractionResult(len(turns), state.covers_up_to_seq, method, recorded, errors, more)


def extraction_payload(result: ExtractionResult) -> dict[str, Any]:
    return {
        "turns": result.turns,
        "covers_up_to_seq": result.covers_up_to_seq,
        "method": result.method,
        "recorded": result.recorded,
        "more": result.more,
        **({"errors": result.errors[:3]} if result.errors else {}),
    }
