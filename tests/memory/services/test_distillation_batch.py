"""Distillation drains in coalesced job runs: many finished tasks, few runs, each task
distilled exactly once. Real PostgreSQL and the job outbox, run in-process."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory.models import Event, Experience, JobIntent, Task
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
    first = _first_waiting()
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
    real = distillation.extract_direct

    def extract(task):  # a bug met by one task's input only
        if task.pk == poison.pk:
            raise ValueError("cannot parse this transcript")
        return real(task)

    monkeypatch.setattr(distillation, "extract_direct", extract)
    first = _first_waiting()
    assert job_run_task(first.pk) == "done"
    outcome = {i.payload["task"]: (i.status, i.error) for i in JobIntent.objects.filter(kind=jobs.DISTILL)}
    assert outcome[poison.pk] == ("failed", "ValueError: cannot parse this transcript")
    assert [outcome[t.pk][0] for t in (tasks[0], tasks[2])] == ["done", "done"]
    assert Experience.objects.filter(source_task__in=[tasks[0], tasks[2]]).count() == 2
    assert not Experience.objects.filter(source_task=poison).exists()  # its savepoint rolled back


def _finish_all(tenant, fixes, **extra):
    tasks = []
    for problem, fix in fixes:
        task = task_create(tenant=tenant, input=problem, **extra)
        task_update(tenant=tenant, task=task, status="succeeded", output=fix)
        tasks.append(task)
    return tasks


def _first_waiting(**filters: Any) -> JobIntent:
    intent = JobIntent.objects.filter(kind=jobs.DISTILL, **filters).order_by("pk").first()
    assert intent is not None
    return intent


def _stored(tenant):
    """What a distillation left, with ids replaced by positions: experiences (texts, method, task,
    confidence, merges, provenance) and each stream's events (type, task, outcomes) in order."""
    tasks = {
        t.public_id: f"task-{n}" for n, t in enumerate(Task.objects.filter(tenant=tenant).order_by("pk"))
    }
    rows = [
        (e.problem, e.solution, e.extraction_method, tasks[e.provenance[0]["task"]], e.confidence,
         e.merge_count, [(p["method"], tasks[p["task"]], p.get("merge")) for p in e.provenance])
        for e in Experience.objects.filter(tenant=tenant).order_by("pk")
    ]  # fmt: skip
    streams: dict[str, list] = {}
    for e in Event.objects.filter(tenant=tenant, type__startswith="experience.").order_by("stream", "seq"):
        streams.setdefault(e.stream, []).append(
            (e.type, tasks[e.payload["task"]], e.payload.get("similarity"))
        )
    for e in Event.objects.filter(tenant=tenant, type="memory.distilled").order_by("stream", "seq"):
        streams.setdefault(e.stream, []).append((e.type, tasks[e.payload["task"]], e.payload["outcomes"]))
    return rows, sorted(streams.values())


def test_a_run_of_several_stores_what_one_task_at_a_time_stores(tenant_a, tenant_b, monkeypatch):
    # Duplicates within the run (the same fix twice, by two tasks) and of a stored row.
    fixes = [*FIXES, FIXES[0], ("A new problem", "A new fix")]
    _finish_all(tenant_a, fixes)
    assert job_run_task(_first_waiting(tenant=tenant_a).pk) == "done"

    from memory.services import distillation

    monkeypatch.setattr(distillation, "DISTILL_BATCH", 1)  # one task per run: the reference
    _finish_all(tenant_b, fixes)
    for intent in JobIntent.objects.filter(kind=jobs.DISTILL, tenant=tenant_b).order_by("pk"):
        assert job_run_task(intent.pk) == "done"

    # Each stream's `experience.*` events and `memory.distilled` events in the same order (a run
    # of several records all its `experience.*` events before its `memory.distilled` ones).
    assert _stored(tenant_a) == _stored(tenant_b)
    assert Experience.objects.filter(tenant=tenant_a, merge_count=1).count() == 1  # FIXES[0] twice
    created = Event.objects.filter(tenant=tenant_a, type="experience.created").count()
    assert created == len(fixes) - 1


def test_a_run_that_cannot_write_at_once_distils_one_task_at_a_time(tenant_a, monkeypatch):
    from memory.services import distillation

    tasks = _finish_all(tenant_a, FIXES)
    poison = tasks[2]
    real = distillation.experience_create

    def broken_bulk(**kwargs):
        raise ValueError("the set-based write broke")

    def create(**kwargs):  # the one-at-a-time path meets a bug for one task only
        if kwargs["source_task"].pk == poison.pk:
            raise ValueError("cannot store this one")
        return real(**kwargs)

    monkeypatch.setattr(distillation, "experiences_create_sourced", broken_bulk)
    monkeypatch.setattr(distillation, "experience_create", create)
    assert job_run_task(_first_waiting().pk) == "done"
    status = {i.payload["task"]: i.status for i in JobIntent.objects.filter(kind=jobs.DISTILL)}
    assert status == {tasks[0].pk: "done", tasks[1].pk: "done", poison.pk: "failed"}
    assert Experience.objects.filter(source_task__in=tasks[:2]).count() == 2
    assert not Experience.objects.filter(source_task=poison).exists()
    distilled = Event.objects.filter(tenant=tenant_a, type="memory.distilled")
    assert sorted(e.payload["task"] for e in distilled) == sorted(t.public_id for t in tasks[:2])


def test_a_run_costs_the_same_statements_for_10_tasks_as_for_40(tenant_a):
    """Set-based: a run's statements do not grow with its tasks (tasks without a session)."""
    counts = []
    for n in (10, 40):
        _finish_all(tenant_a, [(f"Problem {n}-{i} of the export", f"Fix {n}-{i}") for i in range(n)])
        first = _first_waiting(status="pending")
        with CaptureQueriesContext(connection) as queries:
            assert job_run_task(first.pk) == "done"
        counts.append(len(queries))
        assert Experience.objects.filter(tenant=tenant_a).count() == (10 if n == 10 else 50)
    assert counts[1] <= counts[0] <= 25, counts  # one task at a time: ~13 statements a task
