"""Celery tasks of the job outbox (memory/services/jobs.py), and what each job kind runs.

Thin: an intent id in, one service call. The kinds are registered here, in the adapter layer
that imports the services doing the work, so that the outbox (which those services use to
enqueue) imports none of them. Every process that runs jobs loads this module: a worker loads
all task modules, and `job_run` is called only by `job_run_task`.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.schedules import crontab
from celery.signals import worker_ready
from django.conf import settings
from django.db import OperationalError

from memory.models import JobIntent, Session
from memory.services import job_health, jobs
from memory.services.distillation import distill_intents_merge, tasks_distill_intents
from memory.services.embedding import EmbedderUnavailable
from memory.services.experiences import experiences_embed, experiences_mark_failed
from memory.services.rolling_summary import session_summarise
from memory.services.session_digest import session_digest_update
from memory.services.user_memory import extraction
from memory.services.user_memory.embed import user_memories_embed, user_memories_mark_failed


@shared_task(acks_late=True, name=jobs.JOB_RUN_TASK)
def job_run_task(intent_id: int) -> str:
    """Run one job intent. Idempotent: a second delivery finds it done or held, and does nothing."""
    return jobs.job_run(intent_id=intent_id)


@shared_task(acks_late=True, name="memory.jobs.sweep")
def jobs_sweep_task(redispatch_after: float | None = None) -> int:
    """Dispatch again the intents a lost message or a dead worker left behind. Safe to overlap."""
    return jobs.jobs_sweep(redispatch_after=redispatch_after)


@shared_task(name="memory.jobs.heartbeat", ignore_result=True)
def jobs_heartbeat_task() -> None:
    """Prove that a worker runs tasks (memory/services/job_health.py)."""
    job_health.heartbeat_record()


@worker_ready.connect
def _pick_up_at_start(sender: Any = None, **kwargs: Any) -> None:
    # A worker that starts (again) takes over at once what its predecessor left pending, instead
    # of after the next sweep: the messages a killed worker held are lost or come back only after
    # the broker's visibility timeout. A duplicate delivery is harmless (job_run is idempotent).
    jobs_sweep_task.apply_async(kwargs={"redispatch_after": 0.0})
    jobs_heartbeat_task.apply_async()


@shared_task(acks_late=True, name="memory.jobs.purge")
def jobs_purge_task() -> int:
    """Delete finished intents older than CTXAPP_JOB_KEEP_DAYS."""
    return jobs.jobs_purge()


SCHEDULE: dict = {
    "jobs-sweep": {
        "task": "memory.jobs.sweep",
        "schedule": settings.CTXAPP.job_sweep_seconds,
    },
    "jobs-purge": {"task": "memory.jobs.purge", "schedule": crontab(minute=17)},
    "jobs-heartbeat": {
        "task": "memory.jobs.heartbeat",
        "schedule": job_health.HEARTBEAT_SECONDS,
        # A heartbeat older than the deadline proves nothing: a wedged worker that comes back
        # must not stamp a fresh heartbeat from a backlog of old ones.
        "options": {"expires": job_health.heartbeat_deadline_seconds()},
    },
}


# --- the kinds ----------------------------------------------------------------------------------


def _embed_run(intents: list[JobIntent]) -> dict[str, Any]:
    ids = jobs.embed_intent_ids(intents)
    return {"experiences": len(ids), "embedded": experiences_embed(experience_ids=ids)}


def _embed_failed(intents: list[JobIntent], reason: str) -> None:
    experiences_mark_failed(experience_ids=jobs.embed_intent_ids(intents), reason=reason)


def _summarise_run(intents: list[JobIntent]) -> dict[str, Any]:
    session = (
        Session.objects.select_related("tenant", "agent").filter(pk=intents[0].payload.get("session")).first()
    )
    if session is None:
        return {"skipped": "session deleted"}
    summary = session_summarise(tenant=session.tenant, session=session)
    return {"session": session.public_id, "summary": summary.public_id if summary else None}


def _digest_run(intents: list[JobIntent]) -> dict[str, Any]:
    session = Session.objects.select_related("tenant").filter(pk=intents[0].payload.get("session")).first()
    if session is None:  # deleted meanwhile: nothing to digest
        return {"skipped": "session deleted"}
    digest = session_digest_update(tenant=session.tenant, session=session)
    return {"session": session.public_id, "version": digest.version if digest is not None else None}


def _extract_run(intents: list[JobIntent]) -> dict[str, Any]:
    session = (
        Session.objects.select_related("tenant", "agent").filter(pk=intents[0].payload.get("session")).first()
    )
    if session is None:  # deleted meanwhile: nothing to remember
        return {"skipped": "session deleted"}
    return extraction.extraction_payload(extraction.session_memories_extract(session=session))


def _user_memory_embed_run(intents: list[JobIntent]) -> dict[str, Any]:
    tenants = sorted({i.tenant_id for i in intents if i.tenant_id is not None})
    return {"embedded": sum(user_memories_embed(tenant_id=t) for t in tenants)}


def _user_memory_embed_failed(intents: list[JobIntent], reason: str) -> None:
    for tenant_id in {i.tenant_id for i in intents if i.tenant_id is not None}:
        user_memories_mark_failed(tenant_id=tenant_id, reason=reason)


def _register_kinds() -> None:
    jobs.job_kind_register(
        jobs.EMBED,
        jobs.JobKind(
            run=_embed_run,
            transient=(EmbedderUnavailable, OperationalError),
            max_attempts=jobs.embed_max_attempts,
            backoff=jobs.embed_backoff,
            on_failure=_embed_failed,
            merge=jobs.embed_intents_merge,
        ),
    )
    jobs.job_kind_register(jobs.DISTILL, jobs.JobKind(run=tasks_distill_intents, merge=distill_intents_merge))
    jobs.job_kind_register(jobs.SUMMARISE, jobs.JobKind(run=_summarise_run))
    jobs.job_kind_register(jobs.DIGEST, jobs.JobKind(run=_digest_run))
    jobs.job_kind_register(jobs.USER_MEMORY_EXTRACT, jobs.JobKind(run=_extract_run))
    jobs.job_kind_register(
        jobs.USER_MEMORY_EMBED,
        jobs.JobKind(
            run=_user_memory_embed_run,
            transient=(EmbedderUnavailable, OperationalError),
            max_attempts=jobs.embed_max_attempts,
            backoff=jobs.embed_backoff,
            on_failure=_user_memory_embed_failed,
        ),
    )


_register_kinds()
