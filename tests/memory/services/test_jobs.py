"""The job outbox (memory/services/jobs.py): a write and its job commit together; a broker that is
down never fails the write; a job runs once however often it is delivered; experience embedding
is coalesced; the sweep finds what a lost message or a dead worker left behind.

The broker is real: a Redis URL on a port nothing listens on is a broker that is down."""

from __future__ import annotations

import dataclasses
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from memory.models import Event, Experience, JobIntent, Summary, Tenant
from memory.services import jobs
from memory.services.experiences import experience_create
from memory.services.sessions import session_create, task_create, task_update
from memory.tasks import jobs as job_tasks

pytestmark = pytest.mark.django_db


def finished_task(tenant: Tenant, *, distill: str = "full") -> Any:
    session = session_create(tenant=tenant, agent_external_id="agent-1")
    task = task_create(tenant=tenant, session=session, input="deploy failed", metadata={"distill": distill})
    return task_update(tenant=tenant, task=task, status="succeeded", output="pinned the base image")


def test_writes_answer_2xx_with_the_broker_down_and_keep_their_jobs(
    api_a: Any, tenant_a: Tenant, broker_down: None, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        created = api_a.post(
            "/api/v1/experiences", {"problem": "disk full", "solution": "rotate logs"}, format="json"
        )
    assert created.status_code == 201, created.content
    experience = Experience.objects.get(public_id=created.json()["id"])
    embed = JobIntent.objects.get(kind=jobs.EMBED)
    assert embed.status == "pending" and embed.payload == {"ids": [experience.pk]}

    session = api_a.post("/api/v1/sessions", {"agent": "bot"}, format="json").json()
    task = api_a.post("/api/v1/tasks", {"session": session["id"], "title": "fix"}, format="json").json()
    with django_capture_on_commit_callbacks(execute=True):
        done = api_a.patch(
            f"/api/v1/tasks/{task['id']}", {"status": "succeeded", "output": "ok"}, format="json"
        )
    assert done.status_code == 200, done.content
    distill = JobIntent.objects.get(kind=jobs.DISTILL)
    assert distill.status == "pending" and distill.tenant == tenant_a

    response = api_a.get("/readyz")
    assert response.status_code == 200 and response.json()["status"] == "degraded"
    assert response.json()["checks"]["broker"]["jobs_waiting"] == 2


def test_a_rolled_back_write_leaves_no_job(tenant_a: Tenant) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        experience_create(tenant=tenant_a, problem="p1", solution="s1")
        raise RuntimeError("half-way")
    assert not JobIntent.objects.exists() and not Experience.objects.exists()


def test_a_job_runs_once_however_often_it_is_delivered(tenant_a: Tenant) -> None:
    task = finished_task(tenant_a)
    [intent] = JobIntent.objects.filter(kind=jobs.DISTILL)
    assert jobs.job_run(intent_id=intent.pk) == "done"
    assert jobs.job_run(intent_id=intent.pk) == "skipped"  # a redelivered message
    intent.refresh_from_db()
    assert (
        intent.status == "done" and intent.attempts == 1 and (intent.result or {})["task"] == task.public_id
    )
    full = Event.objects.filter(type="memory.distilled", payload__task=task.public_id, payload__path="full")
    assert full.count() == 1


def test_asking_twice_for_a_job_nobody_took_yet_coalesces(tenant_a: Tenant) -> None:
    from memory.services.distillation import task_distill

    task = finished_task(tenant_a, distill="none")
    with transaction.atomic():
        task_distill(tenant=tenant_a, task=task, mode="full")
        task_distill(tenant=tenant_a, task=task, mode="full")
    assert JobIntent.objects.filter(kind=jobs.DISTILL).count() == 1
    jobs.job_run(intent_id=JobIntent.objects.get().pk)
    with transaction.atomic():  # taken and done: a new request is a new job
        task_distill(tenant=tenant_a, task=task, mode="full")
    assert JobIntent.objects.filter(kind=jobs.DISTILL, status="pending").count() == 1


@pytest.mark.django_db(transaction=True)
def test_single_row_writes_share_one_embedding_run(tenant_a: Tenant, broker_down: None) -> None:
    rows = [
        experience_create(tenant=tenant_a, problem=f"problem {word}", solution=f"fix {word}").experience
        for word in ("alpha", "bravo", "charlie", "delta", "echo")
    ]  # five transactions, five intents
    intents = list(JobIntent.objects.filter(kind=jobs.EMBED).order_by("pk"))
    assert len(intents) == 5
    assert jobs.job_run(intent_id=intents[0].pk) == "done"  # takes every pending one (up to 64 rows)
    assert [jobs.job_run(intent_id=i.pk) for i in intents[1:]] == ["skipped"] * 4
    assert set(Experience.objects.values_list("embedding_status", flat=True)) == {"completed"}
    assert Event.objects.filter(type="experience.embedded").count() == len(rows)
    assert {
        (i.status, i.merged_into) for i in JobIntent.objects.filter(pk__in=[i.pk for i in intents[1:]])
    } == {("done", intents[0].pk)}
    assert JobIntent.objects.get(pk=intents[0].pk).result == {"experiences": 5, "embedded": 5}


def test_one_transaction_writes_one_intent_per_batch(tenant_a: Tenant, settings: Any) -> None:
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, embedding_batch_size=2)
    with transaction.atomic():
        for word in ("alpha", "bravo", "charlie", "delta", "echo"):
            experience_create(tenant=tenant_a, problem=f"problem {word}", solution=f"fix {word}")
    sizes = [len(p["ids"]) for p in JobIntent.objects.order_by("pk").values_list("payload", flat=True)]
    assert sizes == [2, 2, 1]


def test_the_sweep_dispatches_lost_and_orphaned_jobs_but_not_fresh_ones(tenant_a: Tenant) -> None:
    experience_create(tenant=tenant_a, problem="p1", solution="s1")
    finished_task(tenant_a)
    assert jobs.jobs_sweep() == 0  # both just dispatched
    old = timezone.now() - timedelta(minutes=5)
    JobIntent.objects.filter(kind=jobs.EMBED).update(dispatched_at=old)  # its message was lost
    JobIntent.objects.filter(kind=jobs.DISTILL).update(status="running", dispatched_at=old)  # worker died
    assert jobs.jobs_sweep() == 2
    assert jobs.jobs_sweep() == 0  # dispatched again just now
    for intent in JobIntent.objects.all():
        assert jobs.job_run(intent_id=intent.pk) == "done"


@pytest.mark.django_db(transaction=True)
def test_a_job_held_by_a_live_runner_is_neither_run_nor_swept_again(tenant_a: Tenant) -> None:
    finished_task(tenant_a)
    intent = JobIntent.objects.get(kind=jobs.DISTILL)
    JobIntent.objects.filter(pk=intent.pk).update(
        status="running", dispatched_at=timezone.now() - timedelta(minutes=5)
    )
    holding, release = threading.Event(), threading.Event()

    def live_runner() -> None:  # another connection holds the row, as job_run does while running
        try:
            with transaction.atomic():
                JobIntent.objects.select_for_update().get(pk=intent.pk)
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=live_runner)
    thread.start()
    try:
        assert holding.wait(30)
        assert jobs.jobs_sweep() == 0
        assert jobs.job_run(intent_id=intent.pk) == "skipped"
    finally:
        release.set()
        thread.join(30)
    assert jobs.jobs_sweep() == 1  # the runner is gone without finishing: found at once
    assert jobs.job_run(intent_id=intent.pk) == "done"


def test_summarisation_is_a_job_too(tenant_a: Tenant, api_a: Any) -> None:
    from memory.services.sessions import MessageInput, messages_append

    session = session_create(tenant=tenant_a, agent_external_id="bot")
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[MessageInput(role="user", content=f"message number {i}") for i in range(30)],
    )
    response = api_a.post(f"/api/v1/sessions/{session.public_id}/summaries", format="json")
    assert response.status_code == 202
    intent = JobIntent.objects.get(kind=jobs.SUMMARISE)
    assert jobs.job_run(intent_id=intent.pk) == "done"
    assert Summary.objects.filter(session=session).count() == 1
    intent.refresh_from_db()
    assert (intent.result or {})["summary"] == Summary.objects.get().public_id


def test_every_kind_runs_where_its_task_runs() -> None:
    # memory/tasks/jobs.py, which every worker loads, registers what each kind runs; the outbox
    # sends intents to its task by name.
    assert set(jobs.HANDLERS) == jobs.KINDS
    assert job_tasks.job_run_task.name == jobs.JOB_RUN_TASK


def test_a_thread_sends_on_one_kept_broker_connection() -> None:
    jobs._producer_drop()
    assert jobs.tasks_send(jobs.JOB_RUN_TASK, [(0,), (0,)]) == 2  # (intent 0 does not exist)
    kept = jobs._producers.entry
    assert kept is not None
    assert jobs.tasks_send(jobs.JOB_RUN_TASK, [(0,)]) == 1
    assert jobs._producers.entry is kept  # no new connection, no new queue declaration
    jobs._producer_drop()
    assert jobs._producers.entry is None


def test_a_broker_that_is_down_keeps_no_connection_and_answers_at_once(broker_down: None) -> None:
    jobs._producer_drop()
    started = timezone.now()
    assert jobs.tasks_send(jobs.JOB_RUN_TASK, [(0,), (0,)]) == 0
    assert jobs._producers.entry is None  # the next send tries a fresh connection
    assert (timezone.now() - started).total_seconds() < 3  # not Kombu's ~6 s of retries


@pytest.mark.django_db(transaction=True)
def test_an_embedding_run_locks_only_the_intents_it_takes(tenant_a: Tenant, settings: Any) -> None:
    """With two workers: an intent a run leaves out is run by the worker its own message reaches."""
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, embedding_batch_size=2)
    for word in ("alpha", "bravo", "charlie"):
        experience_create(tenant=tenant_a, problem=f"problem {word}", solution=f"fix {word}")
    first, second, third = JobIntent.objects.filter(kind=jobs.EMBED).order_by("pk")
    holding, release = threading.Event(), threading.Event()
    taken: list[int] = []

    def running() -> None:  # the run of `first`, holding what its merge locked
        try:
            with transaction.atomic():
                taken.extend(i.pk for i in jobs.embed_intents_merge(first))
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=running)
    thread.start()
    try:
        assert holding.wait(30)
        assert taken == [second.pk]  # one row of room left in a batch of two
        assert jobs.job_run(intent_id=second.pk) == "skipped"  # the running merge has it
        assert jobs.job_run(intent_id=third.pk) == "done"  # not locked by a run that left it out
    finally:
        release.set()
        thread.join(30)
    assert JobIntent.objects.get(pk=third.pk).status == "done"
