"""Distillation of finished tasks into experiences.

CONTRACT (called by sessions.task_update when a task becomes succeeded or failed, inside its
transaction; keep this signature): `task_finished(tenant=, task=)`.

Two paths:

- light (`task_distill_light`): the direct extractor only — the task's input is the problem,
  its output the solution — stored at once, plus a `memory.distilled` event. No model involved.
- full (`task_distill_full`, a Celery job queued after commit): three extractors
    * direct  — from the task's input and output (confidence 0.7; 0.3 for a failed task);
    * pattern — user-problem → assistant-solution turns of the task's session, with the message
                seqs as provenance (confidence 0.5, +0.2 when the user confirms it worked);
    * summary — the summariser's OpenAI-compatible chat endpoint (CTXAPP_SUMMARISER_*) asked for
                JSON; malformed output is retried (CTXAPP_SUMMARISER_RETRIES), then the job falls
                back to the offline extractors and says so in the event — never silently.
  followed by one `memory.distilled` event listing what each extractor produced.

Which path a finished task takes: `task.metadata["distill"]` ("light" | "full" | "none") if the
agent set it, else low value tier → light, normal / high → full.
Re-running either path for the same task is harmless (same text from the same task and method
is "unchanged"; see experiences.experience_create).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings
from django.db import OperationalError, transaction

from memory.exceptions import Conflict, InvalidInput
from memory.models import (
    ExtractionMethod,
    JobIntent,
    JobStatus,
    Message,
    MessageRole,
    Task,
    TaskStatus,
    Tenant,
    ValueTier,
)
from memory.services import jobs, recorder
from memory.services.experiences import CreateResult, experience_create

logger = logging.getLogger(__name__)

MODES = ("light", "full")
MAX_PROBLEM_CHARS = 1000
MAX_SOLUTION_CHARS = 4000
MAX_TRANSCRIPT_CHARS = 12_000
MAX_SESSION_MESSAGES = 400
# Finished tasks one distillation job run takes (its own and other waiting ones): a drain of many
# finished tasks costs a few job runs, not one per task. One when the LLM extractor is on (each
# task then waits on the chat endpoint, inside the run's transaction).
DISTILL_BATCH = 50

PROBLEM_RE = re.compile(
    r"\b(error|exception|traceback|fail\w*|broken|crash\w*|time[sd]? ?out|timeout|not work\w*|doesn'?t work|"
    r"won'?t|can'?t|cannot|unable|issue|problem|bug|stuck|slow|hang\w*|denied|refused|"
    r"how (do|can|to|should))\b|\?",
    re.IGNORECASE,
)
SOLUTION_RE = re.compile(
    r"\b(fix\w*|solv\w*|resolv\w*|because|caused by|root cause|try|use|set|add|remove|change|increase|"
    r"decrease|raise|lower|install|upgrade|downgrade|restart|run|enable|disable|replace|update)\b",
    re.IGNORECASE,
)
CONFIRM_RE = re.compile(
    r"\b(thanks?|thank you|that (worked|works|fixed it|did it)|works now|it works|fixed|solved|perfect)\b",
    re.I,
)
CAUSE_RE = re.compile(
    r"(?:root cause(?: is| was)?:?|the (?:issue|problem|cause) (?:is|was)|because(?: of)?|caused by|"
    r"due to)\s+"
    r"([^.\n]{5,300})",
    re.IGNORECASE,
)


class TaskNotFinished(Conflict):
    code = "task_not_finished"
    default_message = "Only a succeeded or failed task can be distilled; finish the task first."


@dataclass
class Candidate:
    problem: str
    solution: str
    cause: str = ""
    confidence: float = 0.5
    method: str = ExtractionMethod.DIRECT
    message_seqs: list[int] = field(default_factory=list)


@dataclass
class DistillResult:
    task: Task
    mode: str
    results: list[CreateResult] = field(default_factory=list)
    extractors: dict[str, Any] = field(default_factory=dict)
    queued: bool = False


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _find_cause(text: str) -> str:
    match = CAUSE_RE.search(text)
    return match.group(1).strip() if match else ""


# --- extractors (pure: they only read) ----------------------------------------------------------


def extract_direct(task: Task) -> list[Candidate]:
    """The task itself: input → problem, output → solution (or, failed, → cause)."""
    problem = task.input.strip() or task.title.strip()
    if not problem:
        return []
    if task.status == TaskStatus.FAILED:
        cause = task.output.strip()
        return [
            Candidate(
                problem=_clip(problem, MAX_PROBLEM_CHARS),
                solution="",
                cause=_clip(f"Attempt failed: {cause}" if cause else "Attempt failed.", MAX_SOLUTION_CHARS),
                confidence=0.3,
            )
        ]
    if not task.output.strip():
        return []
    confidence = 0.8 if task.value_tier == ValueTier.HIGH else 0.7
    return [
        Candidate(
            problem=_clip(problem, MAX_PROBLEM_CHARS),
            solution=_clip(task.output, MAX_SOLUTION_CHARS),
            cause=_clip(_find_cause(task.output), MAX_PROBLEM_CHARS),
            confidence=confidence,
        )
    ]


def _session_messages(task: Task) -> list[Message]:
    if task.session_id is None:
        return []
    queryset = Message.objects.filter(session_id=task.session_id)
    if task.finished_at is not None:
        queryset = queryset.filter(created_at__lte=task.finished_at)
    return list(queryset.order_by("-seq")[:MAX_SESSION_MESSAGES])[::-1]


def extract_patterns(messages: list[Message]) -> list[Candidate]:
    """User-problem → assistant-solution turns: a user message that states a problem, the
    assistant replies up to the next user message that propose a fix; confirmed when the next
    user message says it worked."""
    candidates: list[Candidate] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.role != MessageRole.USER or not PROBLEM_RE.search(message.content or ""):
            index += 1
            continue
        replies: list[Message] = []
        cursor = index + 1
        while cursor < len(messages) and messages[cursor].role != MessageRole.USER:
            if messages[cursor].role == MessageRole.ASSISTANT and (messages[cursor].content or "").strip():
                replies.append(messages[cursor])
            cursor += 1
        solution_text = "\n".join(r.content.strip() for r in replies)
        if replies and SOLUTION_RE.search(solution_text):
            seqs = [message.seq, *(r.seq for r in replies)]
            confidence = 0.5
            if cursor < len(messages) and CONFIRM_RE.search(messages[cursor].content or ""):
                confidence = 0.7
                seqs.append(messages[cursor].seq)
            candidates.append(
                Candidate(
                    problem=_clip(message.content, MAX_PROBLEM_CHARS),
                    solution=_clip(solution_text, MAX_SOLUTION_CHARS),
                    cause=_clip(_find_cause(solution_text), MAX_PROBLEM_CHARS),
                    confidence=confidence,
                    method=ExtractionMethod.PATTERN,
                    message_seqs=seqs,
                )
            )
        index = cursor
    return candidates


SUMMARY_SYSTEM_PROMPT = (
    "You distil reusable experience from an agent's finished task. Reply with JSON only, no prose: "
    '{"experiences": [{"problem": str, "cause": str, "solution": str, "confidence": number 0..1, '
    '"message_seqs": [int]}]}. One entry per distinct problem that was actually solved; '
    "an empty list if nothing reusable was learned."
)


class MalformedModelOutput(ValueError):
    pass


def parse_summary_output(text: str) -> list[Candidate]:
    """Candidates from the model's reply. Tolerates code fences and prose around one JSON object;
    raises MalformedModelOutput for anything else."""
    cleaned = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    start, end = cleaned.find("{"), cleaned.rfind("}")
    if start < 0 or end <= start:
        raise MalformedModelOutput("no JSON object in the reply")
    try:
        data = json.loads(cleaned[start : end + 1])
    except json.JSONDecodeError as exc:
        raise MalformedModelOutput(f"invalid JSON: {exc}") from None
    items = data.get("experiences") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise MalformedModelOutput('the reply has no "experiences" list')
    candidates = []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or not str(item.get("problem", "")).strip():
            raise MalformedModelOutput(f"experience {position} has no problem")
        try:
            confidence = float(item.get("confidence", 0.6))
        except (TypeError, ValueError):
            raise MalformedModelOutput(f"experience {position} has a non-numeric confidence") from None
        seqs = [int(s) for s in item.get("message_seqs") or [] if isinstance(s, int | float)]
        candidates.append(
            Candidate(
                problem=_clip(str(item["problem"]), MAX_PROBLEM_CHARS),
                cause=_clip(str(item.get("cause") or ""), MAX_PROBLEM_CHARS),
                solution=_clip(str(item.get("solution") or ""), MAX_SOLUTION_CHARS),
                confidence=min(1.0, max(0.0, confidence)),
                method=ExtractionMethod.SUMMARY,
                message_seqs=seqs,
            )
        )
    return candidates


def _transcript(task: Task, messages: list[Message]) -> str:
    lines = [
        f"TASK INPUT:\n{task.input}",
        f"TASK OUTPUT ({task.status}):\n{task.output}",
        "SESSION MESSAGES:",
    ]
    lines += [f"[seq {m.seq}] {m.role}: {m.content}" for m in messages]
    text = "\n".join(lines)
    return text[-MAX_TRANSCRIPT_CHARS:]


def extract_summary(task: Task, messages: list[Message]) -> tuple[list[Candidate], dict[str, Any]]:
    """Ask the configured chat endpoint. Returns (candidates, report). Never raises: after the
    retries the report says `fallback` and why, and the caller keeps the offline results."""
    conf = settings.CTXAPP
    url = conf.summariser_url
    if not url or not conf.distill_llm:
        return [], {"status": "not_configured"}
    attempts = 1 + max(0, conf.summariser_retries)
    chat = [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
        {"role": "user", "content": _transcript(task, messages)},
    ]
    headers = {"Authorization": f"Bearer {conf.summariser_api_key}"} if conf.summariser_api_key else {}
    errors: list[str] = []
    for _attempt in range(attempts):
        try:
            response = httpx.post(
                f"{url.rstrip('/')}/chat/completions",
                json={"model": conf.summariser_model, "messages": chat, "temperature": 0},
                headers=headers,
                timeout=conf.summariser_timeout,
            )
            response.raise_for_status()
            reply = response.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            errors.append(f"request: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        try:
            candidates = parse_summary_output(reply)
        except MalformedModelOutput as exc:
            errors.append(f"malformed output: {exc}")
            chat = [
                *chat,
                {"role": "assistant", "content": reply[:2000]},
                {
                    "role": "user",
                    "content": f"That reply was not valid ({exc}). Reply with the JSON object only.",
                },
            ]
            continue
        return candidates, {"status": "ok", "attempts": len(errors) + 1, "errors": errors}
    logger.warning("LLM-summary extraction of %s fell back to offline extractors: %s", task.public_id, errors)
    return [], {"status": "fallback", "attempts": attempts, "errors": errors}


# --- paths -------------------------------------------------------------------------------------


def _store(*, tenant: Tenant, task: Task, candidates: list[Candidate]) -> list[CreateResult]:
    return [
        experience_create(
            tenant=tenant,
            problem=c.problem,
            cause=c.cause,
            solution=c.solution,
            confidence=c.confidence,
            extraction_method=c.method,
            user_id=task.user_id,
            source_task=task,
            source_session=task.session,
            message_seqs=c.message_seqs,
        )
        for c in candidates
    ]


def _record(*, tenant: Tenant, result: DistillResult) -> None:
    task = result.task
    outcomes: dict[str, int] = {}
    for item in result.results:
        outcomes[item.outcome] = outcomes.get(item.outcome, 0) + 1
    recorder.event_append(
        tenant=tenant,
        type="memory.distilled",
        agent=task.agent,
        session=task.session,
        payload={
            "task": task.public_id,
            "path": result.mode,
            "experiences": [item.experience.public_id for item in result.results],
            "outcomes": outcomes,
            "extractors": result.extractors,
        },
    )


def _require_finished(task: Task) -> None:
    if task.status not in TaskStatus.finished():
        raise TaskNotFinished(details={"task": task.public_id, "status": task.status})


def task_distill_light(*, tenant: Tenant, task: Task) -> DistillResult:
    """Light path: the direct record and a `memory.distilled` event, now. Idempotent."""
    _require_finished(task)
    with transaction.atomic():
        candidates = extract_direct(task)
        result = DistillResult(task=task, mode="light", extractors={"direct": len(candidates)})
        result.results = _store(tenant=tenant, task=task, candidates=candidates)
        if not candidates:
            result.extractors["note"] = "the task has no input or output to learn from"
        _record(tenant=tenant, result=result)
    return result


def task_distill_full(*, tenant: Tenant, task: Task) -> list[CreateResult]:
    """Full path (runs in a Celery job): direct + pattern + LLM-summary extractors, one
    `memory.distilled` event. The chat endpoint is called outside any transaction."""
    _require_finished(task)
    messages = _session_messages(task)
    direct = extract_direct(task)
    patterns = extract_patterns(messages)
    summary, report = extract_summary(task, messages)
    with transaction.atomic():
        result = DistillResult(
            task=task,
            mode="full",
            extractors={
                "direct": len(direct),
                "pattern": len(patterns),
                "summary": {**report, "count": len(summary)},
            },
        )
        result.results = _store(tenant=tenant, task=task, candidates=[*direct, *patterns, *summary])
        _record(tenant=tenant, result=result)
    return result.results


def task_distill(*, tenant: Tenant, task: Task, mode: str = "full") -> DistillResult:
    """Distil a finished task now (light) or queue the full job after commit (full).

    Raises TaskNotFinished (409) for an unfinished task, InvalidInput for an unknown mode.
    """
    if mode not in MODES:
        raise InvalidInput("mode is light or full.", details={"fields": {"mode": ["Unknown mode."]}})
    _require_finished(task)
    if mode == "light":
        return task_distill_light(tenant=tenant, task=task)
    # The job intent is written in the caller's transaction (durable outbox); dispatched on commit.
    jobs.job_enqueue(tenant=tenant, kind=jobs.DISTILL, key=f"task:{task.pk}", payload={"task": task.pk})
    return DistillResult(task=task, mode="full", queued=True)


def distill_mode_for(task: Task) -> str:
    chosen = str((task.metadata or {}).get("distill", "")).lower()
    if chosen in {"light", "full", "none"}:
        return chosen
    return "light" if task.value_tier == ValueTier.LOW else "full"


def task_finished(*, tenant: Any, task: Any) -> None:
    """React to a finished task (light path record and event, or queue full distillation).

    Runs inside task_update's transaction: the light path writes in it, the full path's job is
    queued on its commit. `metadata.distill = "none"` opts a task out (recorded, not silent).
    """
    mode = distill_mode_for(task)
    if mode == "none":
        recorder.event_append(
            tenant=tenant,
            type="memory.distilled",
            agent=task.agent,
            session=task.session,
            payload={"task": task.public_id, "path": "none", "experiences": [], "reason": "opted out"},
        )
        return
    task_distill(tenant=tenant, task=task, mode=mode)


# --- the job kind (registered by memory/tasks/jobs.py) ------------------------------------------


def distill_intents_merge(intent: JobIntent) -> list[JobIntent]:
    """Other waiting distillation intents, oldest first, that the run of `intent` takes too (up to
    DISTILL_BATCH tasks in all; none when the LLM extractor is configured). Locked SKIP LOCKED, so
    two runners never take the same one."""
    conf = settings.CTXAPP
    if conf.summariser_url and conf.distill_llm:
        return []
    return list(
        JobIntent.objects.select_for_update(skip_locked=True)
        .filter(kind=jobs.DISTILL, status=JobStatus.PENDING)
        .exclude(pk=intent.pk)
        .order_by("pk")[: DISTILL_BATCH - 1]
    )


def tasks_distill_intents(intents: list[JobIntent]) -> dict[str, Any]:
    """Run the full distillation of every intent's task (one job run); a purged task is skipped.

    In a run of several, each task is distilled in a savepoint of its own: a task whose
    distillation fails for good (any error but a lost or failing connection, which retries the
    whole run) marks only its own intent failed, and the others are still distilled.
    """
    pks = [int((intent.payload or {}).get("task") or 0) for intent in intents]
    tasks = Task.objects.filter(pk__in=pks).select_related("tenant", "session", "agent").in_bulk()
    distilled: list[str] = []
    failed: list[str] = []
    count = 0
    for intent, pk in zip(intents, pks, strict=True):
        task = tasks.get(pk)
        if task is None:  # purged meanwhile: nothing to learn from
            continue
        if len(intents) == 1:  # its own run: a failure is the run's
            count += len(task_distill_full(tenant=task.tenant, task=task))
            distilled.append(task.public_id)
            continue
        try:
            with transaction.atomic():
                count += len(task_distill_full(tenant=task.tenant, task=task))
        except OperationalError:
            raise  # transient (the kind's retry): the whole run is retried
        except Exception as exc:
            logger.warning("distillation of task %s failed", task.public_id, exc_info=True)
            jobs.job_intent_fail(intent_id=intent.pk, reason=f"{type(exc).__name__}: {exc}")
            failed.append(task.public_id)
            continue
        distilled.append(task.public_id)
    if len(intents) == 1:  # the result of a single run, as before
        return {"task": distilled[0], "experiences": count} if distilled else {"skipped": "task deleted"}
    skipped = len(pks) - len(distilled) - len(failed)
    return {"tasks": distilled, "experiences": count, "skipped": skipped, "failed": failed}
