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

The extractors are in `extract` (they only read). A job run of several finished tasks
(`tasks_distill_intents`) extracts them all, then writes them at once (`tasks_distill_full`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import OperationalError, transaction

from memory.exceptions import Conflict, InvalidInput
from memory.models import JobIntent, JobStatus, Task, TaskStatus, Tenant, ValueTier
from memory.services import jobs, recorder
from memory.services.distillation.extract import (
    MAX_PROBLEM_CHARS,
    MAX_SESSION_MESSAGES,
    MAX_SOLUTION_CHARS,
    MAX_TRANSCRIPT_CHARS,
    SUMMARY_SYSTEM_PROMPT,
    Candidate,
    MalformedModelOutput,
    extract_direct,
    extract_patterns,
    extract_summary,
    parse_summary_output,
    session_messages,
)
from memory.services.experiences import (
    BulkItem,
    CreateResult,
    Source,
    experience_create,
    experience_input_errors,
    experiences_create_sourced,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DISTILL_BATCH",
    "MAX_PROBLEM_CHARS",
    "MAX_SESSION_MESSAGES",
    "MAX_SOLUTION_CHARS",
    "MAX_TRANSCRIPT_CHARS",
    "MODES",
    "SUMMARY_SYSTEM_PROMPT",
    "Candidate",
    "DistillResult",
    "MalformedModelOutput",
    "TaskNotFinished",
    "distill_intents_merge",
    "distill_mode_for",
    "extract_direct",
    "extract_patterns",
    "extract_summary",
    "parse_summary_output",
    "task_distill",
    "task_distill_full",
    "task_distill_light",
    "task_finished",
    "tasks_distill_full",
    "tasks_distill_intents",
]

MODES = ("light", "full")
# Finished tasks one distillation job run takes (its own and other waiting ones): a drain of many
# finished tasks costs a few job runs, not one per task. One when the LLM extractor is on (each
# task then waits on the chat endpoint, inside the run's transaction).
DISTILL_BATCH = 50


class TaskNotFinished(Conflict):
    code = "task_not_finished"
    default_message = "Only a succeeded or failed task can be distilled; finish the task first."


@dataclass
class DistillResult:
    task: Task
    mode: str
    results: list[CreateResult] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    extractors: dict[str, Any] = field(default_factory=dict)
    queued: bool = False


# --- paths -------------------------------------------------------------------------------------


def _agent_of(task: Task) -> str:
    """The external id recorded on the task's experiences: bound keys see only their agent's."""
    return task.agent.external_id if task.agent is not None else ""


def _bulk_item(*, task: Task, candidate: Candidate) -> BulkItem:
    """A candidate as experience_create stores it for `task` (its user, scope from the user)."""
    return BulkItem(
        problem=candidate.problem,
        cause=candidate.cause,
        solution=candidate.solution,
        confidence=candidate.confidence,
        user_id=task.user_id,
        agent=_agent_of(task),
    )


def _source(*, task: Task, candidate: Candidate) -> Source:
    return Source(
        method=candidate.method,
        task=task,
        session=task.session if task.session_id else None,
        message_seqs=candidate.message_seqs,
    )


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
            agent=_agent_of(task),
        )
        for c in candidates
    ]


def _distilled_payload(result: DistillResult) -> dict[str, Any]:
    outcomes: dict[str, int] = {}
    for item in result.results:
        outcomes[item.outcome] = outcomes.get(item.outcome, 0) + 1
    return {
        "task": result.task.public_id,
        "path": result.mode,
        "experiences": [item.experience.public_id for item in result.results],
        "outcomes": outcomes,
        "extractors": result.extractors,
    }


def _record(*, tenant: Tenant, result: DistillResult) -> None:
    task = result.task
    recorder.event_append(
        tenant=tenant,
        type="memory.distilled",
        agent=task.agent,
        session=task.session,
        payload=_distilled_payload(result),
    )


def _record_many(results: list[DistillResult]) -> None:
    """`_record` of each result, in order; one statement per run of results of one stream
    (tenant, agent, session)."""
    runs: list[list[DistillResult]] = []
    for result in results:
        task = result.task
        if runs and (runs[-1][0].task.tenant_id, runs[-1][0].task.agent_id, runs[-1][0].task.session_id) == (
            task.tenant_id,
            task.agent_id,
            task.session_id,
        ):
            runs[-1].append(result)
        else:
            runs.append([result])
    for run in runs:
        task = run[0].task
        recorder.events_append(
            tenant=task.tenant,
            agent=task.agent,
            session=task.session,
            entries=[("memory.distilled", _distilled_payload(result)) for result in run],
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


def _extract_full(task: Task) -> tuple[list[Candidate], dict[str, Any]]:
    """The full path's candidates of a finished `task` and what each extractor found. Writes
    nothing; calls the chat endpoint when it is configured."""
    _require_finished(task)
    messages = session_messages(task)
    direct = extract_direct(task)
    patterns = extract_patterns(messages)
    summary, report = extract_summary(task, messages)
    extractors = {
        "direct": len(direct),
        "pattern": len(patterns),
        "summary": {**report, "count": len(summary)},
    }
    return [*direct, *patterns, *summary], extractors


def task_distill_full(*, tenant: Tenant, task: Task) -> list[CreateResult]:
    """Full path (runs in a Celery job): direct + pattern + LLM-summary extractors, one
    `memory.distilled` event. The chat endpoint is called outside any transaction."""
    candidates, extractors = _extract_full(task)
    with transaction.atomic():
        result = DistillResult(task=task, mode="full", extractors=extractors)
        result.results = _store(tenant=tenant, task=task, candidates=candidates)
        _record(tenant=tenant, result=result)
    return result.results


def tasks_distill_full(results: list[DistillResult]) -> None:
    """The full path's writes for several tasks at once (a job run's): each result's
    `candidates` stored and its `memory.distilled` event recorded, with the same outcomes and
    events as `task_distill_full` one task after the other, in a few statements per tenant
    (experiences_create_sourced) instead of ~13 per task. Fills each result's `results`. Every
    task's `experience.*` events come before the `memory.distilled` events. Call inside the run's
    transaction; raises whatever a write raises (the caller falls back to one task at a time)."""
    by_tenant: dict[int, list[DistillResult]] = {}
    for result in results:
        by_tenant.setdefault(result.task.tenant_id, []).append(result)
    for group in by_tenant.values():
        items = [
            (_bulk_item(task=result.task, candidate=c), _source(task=result.task, candidate=c))
            for result in group
            for c in result.candidates
        ]
        created = iter(experiences_create_sourced(tenant=group[0].task.tenant, items=items))
        for result in group:
            result.results = [next(created) for _ in result.candidates]
    _record_many(results)


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


@dataclass
class _RunOutcome:
    distilled: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    experiences: int = 0


def tasks_distill_intents(intents: list[JobIntent]) -> dict[str, Any]:
    """Run the full distillation of every intent's task (one job run); a purged task is skipped.

    A run of one distils its task; a failure is the run's. A run of several extracts every task's
    candidates, then writes them all at once (`tasks_distill_full`) in a savepoint. A task whose
    distillation fails for good (any error but a lost or failing connection, which retries the
    whole run) marks only its own intent failed, and the others are still distilled: a task whose
    extraction fails, or whose candidates experience_create would refuse, is distilled alone in
    a savepoint of its own; if the set-based write fails, it is rolled back and every task is
    distilled that way.
    """
    pks = [int((intent.payload or {}).get("task") or 0) for intent in intents]
    tasks = Task.objects.filter(pk__in=pks).select_related("tenant", "session__agent", "agent").in_bulk()
    found = [(intent, tasks[pk]) for intent, pk in zip(intents, pks, strict=True) if pk in tasks]
    if len(intents) == 1:  # its own run: a failure is the run's; its result as before
        if not found:  # purged meanwhile: nothing to learn from
            return {"skipped": "task deleted"}
        task = found[0][1]
        return {"task": task.public_id, "experiences": len(task_distill_full(tenant=task.tenant, task=task))}
    outcome = _RunOutcome()
    ready: list[tuple[JobIntent, DistillResult]] = []
    alone: list[tuple[JobIntent, Task]] = []
    for intent, task in found:
        try:
            candidates, extractors = _extract_full(task)
        except OperationalError:
            raise  # transient (the kind's retry): the whole run is retried
        except Exception as exc:
            _task_failed(intent=intent, task=task, exc=exc, outcome=outcome)
            continue
        if any(_refused(task=task, candidate=c) for c in candidates):
            alone.append((intent, task))
            continue
        result = DistillResult(task=task, mode="full", extractors=extractors, candidates=candidates)
        ready.append((intent, result))
    try:
        with transaction.atomic():
            tasks_distill_full([result for _, result in ready])
    except OperationalError:
        raise
    except Exception:
        logger.warning("a distillation run's set-based write failed; one task at a time", exc_info=True)
        alone = [(intent, result.task) for intent, result in ready] + alone
        ready = []
    for _, result in ready:
        outcome.distilled.append(result.task.public_id)
        outcome.experiences += len(result.results)
    for intent, task in alone:
        _task_distill_alone(intent=intent, task=task, outcome=outcome)
    skipped = len(pks) - len(outcome.distilled) - len(outcome.failed)
    return {
        "tasks": outcome.distilled,
        "experiences": outcome.experiences,
        "skipped": skipped,
        "failed": outcome.failed,
    }


def _refused(*, task: Task, candidate: Candidate) -> bool:
    """Whether experience_create would refuse `candidate` (InvalidInput)."""
    item = _bulk_item(task=task, candidate=candidate)
    return bool(
        experience_input_errors(
            problem=item.problem, confidence=item.confidence, scope=item.scope, user_id=item.user_id
        )
    )


def _task_distill_alone(*, intent: JobIntent, task: Task, outcome: _RunOutcome) -> None:
    """Distil `task` in a savepoint of its own; a failure marks only its intent failed."""
    try:
        with transaction.atomic():
            outcome.experiences += len(task_distill_full(tenant=task.tenant, task=task))
    except OperationalError:
        raise  # transient (the kind's retry): the whole run is retried
    except Exception as exc:
        _task_failed(intent=intent, task=task, exc=exc, outcome=outcome)
        return
    outcome.distilled.append(task.public_id)


def _task_failed(*, intent: JobIntent, task: Task, exc: Exception, outcome: _RunOutcome) -> None:
    logger.warning("distillation of task %s failed", task.public_id, exc_info=True)
    jobs.job_intent_fail(intent_id=intent.pk, reason=f"{type(exc).__name__}: {exc}")
    outcome.failed.append(task.public_id)
