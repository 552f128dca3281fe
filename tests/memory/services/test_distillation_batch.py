"""Distillation drains in coalesced job runs (issue 15): many finished tasks, few runs, each task
distilled exactly once. Real PostgreSQL and the job outbox, run in-process."""

from __future__ import annotations

import pytest

from memory.models import Event, Experience, JobIntent
from memory.services import jobs
from memory.services.sessions import task_create, task_update
from memory.tasks.jobs import job_run_task

pytestmark = pytest.mark.django_db

FIXES = [
    ("The nightly export times out", "Added an index on exports.created_at"),
    ("Login fails with a 502 from the proxy", "Bound the upstream to 0.0.0.0"),
    ("The mailer queue is stuck", "Restarted the worker after raising its memory limit"),
]


def test_finished_tasks_are_distilled_by_one_job_run_each_exactly_once(tenant_a):
    tasks = []
    for problem, fix in FIXES:
        task = task_create(tenant=tenant_a, input=problem)
        task_update(tenant=tenant_a, task=task, status="succeeded", output=fix)
        tasks.append(task)
    intents = list(JobIntent.objects.filter(kind=jobs.DISTILL).order_by("pk"))
    assert len(intents) == len(FIXES)  # one durable intent per finished task (the 2xx's promise)

    assert job_run_task(intents[0].pk) == "done"  # the first run takes the waiting ones too
    for intent in intents:
        intent.refresh_from_db()
        assert intent.status == "done"
        assert job_run_task(intent.pk) == "skipped"  # a redelivery distils nothing twice
    assert {i.merged_into for i in intents[1:]} == {intents[0].pk}

    for task, (problem, fix) in zip(tasks, FIXES, strict=True):
        [experience] = Experience.objects.filter(source_task=task)
        assert (experience.problem, experience.solution) == (problem, fix)
    distilled = Event.objects.filter(tenant=tenant_a, type="memory.distilled")
    assert sorted(e.payload["task"] for e in distilled) == sorted(t.public_id for t in tasks)


def test_a_run_skips_a_task_purged_meanwhile_and_distils_the_others(tenant_a):
    kept = task_create(tenant=tenant_a, input=FIXES[0][0])
    purged = task_create(tenant=tenant_a, input=FIXES[1][0])
    for task, (_, fix) in ((purged, FIXES[1]), (kept, FIXES[0])):
        task_update(tenant=tenant_a, task=task, status="succeeded", output=fix)
    purged.delete()
    first = JobIntent.objects.filter(kind=jobs.DISTILL).order_by("pk").first()
    assert job_run_task(first.pk) == "done"
    assert Experience.objects.filter(source_task=kept).count() == 1
    assert set(JobIntent.objects.filter(kind=jobs.DISTILL).values_list("status", flat=True)) == {"done"}


def test_a_task_that_cannot_be_distilled_fails_alone_and_the_others_are_distilled(tenant_a, monkeypatch):
    from memory.services import distillation

    tasks = []
    for problem, fix in FIXES:
        task = task_create(tenant=tenant_a, input=problem)
        task_update(tenant=tenant_a, task=task, status="succeeded", output=fix)
        tasks.append(task)
    poison = tasks[1]
    real = distillation.task_distill_full

    def distill(*, tenant, task):  # a bug met by one task's input only
        if task.pk == poison.pk:
            raise ValueError("cannot parse this transcript")
        return real(tenant=tenant, task=task)

    monkeypatch.setattr(distillation, "task_distill_full", distill)
    first = JobIntent.objects.filter(kind=jobs.DISTILL).order_by("pk").first()
    assert job_run_task(first.pk) == "done"
    outcome = {i.payload["task"]: (i.status, i.error) for i in JobIntent.objects.filter(kind=jobs.DISTILL)}
    assert outcome[poison.pk] == ("failed", "ValueError: cannot parse this transcript")
    assert [outcome[t.pk][0] for t in (tasks[0], tasks[2])] == ["done", "done"]
    assert Experience.objects.filter(source_task__in=[tasks[0], tasks[2]]).count() == 2
    assert not Experience.objects.filter(source_task=poison).exists()  # its savepoint rolled back
