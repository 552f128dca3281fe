"""Embedding with a REAL Celery worker: killed mid-batch (SIGKILL) → every experience completes
exactly once; an embedder that keeps failing → `failed` with the reason after the retries, and
the retry command recovers them.

The embedder is the OpenAI-compatible one pointed at a local HTTP server (the only test double:
a remote endpoint)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import transaction

from memory.models import Event, Experience, Tenant
from memory.services.experiences import experience_create
from tests.conftest import worker_env
from tests.memory.services.experience_servers import FakeOpenAI

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def endpoint() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    yield server
    server.close()


@pytest.fixture
def tenant(transactional_db: None) -> Tenant:
    return Tenant.objects.create(name="Alice's team", slug="alice")


def start_worker(endpoint: FakeOpenAI, **extra: str) -> subprocess.Popen[bytes]:
    env = worker_env()
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.memory.services.embed_worker_settings",
            "CTXAPP_EMBEDDER": "openai",
            "CTXAPP_EMBEDDING_URL": endpoint.url,
            "CTXAPP_EMBEDDING_TIMEOUT": "60",
            **extra,
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ctxapp", "worker", "--loglevel", "warning",
         "--concurrency", "1", "--queues", f"{settings.QUEUE_PREFIX}-default",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "--pool", "solo"],
        env=env, cwd=os.getcwd(),
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    # A worker started in its own session (with -B) leads its group: stop its beat child too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def wait_until(condition, timeout: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the worker"
        time.sleep(0.2)


# Distinct words, so the bag-of-words test vectors neither merge nor supersede each other.
TEXTS = [
    ("nginx answers 502", "bind upstream wildcard address"),
    ("postgres query timeout", "composite index created"),
    ("jvm killed oom", "raise container memory limit"),
    ("dns lookups flaky", "switch resolver cache"),
    ("cron skipped jobs", "timezone utc scheduler"),
    ("tls handshake expired", "renew certificate chain"),
]


def create_batch(tenant: Tenant, count: int) -> list[Experience]:
    with transaction.atomic():  # one transaction → one embedding job for the whole batch
        return [
            experience_create(tenant=tenant, problem=problem, solution=solution).experience
            for problem, solution in TEXTS[:count]
        ]


def statuses(rows: list[Experience]) -> list[str]:
    return list(
        Experience.objects.filter(pk__in=[r.pk for r in rows]).values_list("embedding_status", flat=True)
    )


def test_a_worker_killed_mid_batch_is_redelivered_and_every_row_completes_once(tenant, endpoint):
    endpoint.mode = "hang"
    rows = create_batch(tenant, 6)
    worker = start_worker(endpoint)
    try:
        assert endpoint.request_arrived.wait(60), "the worker never called the embedder"
        worker.send_signal(signal.SIGKILL)  # mid-batch: vectors requested, nothing written
        worker.wait(10)
        assert statuses(rows) == ["pending"] * 6
        endpoint.release()
        worker = start_worker(endpoint)  # the unacknowledged job comes back to this one
        wait_until(lambda: statuses(rows) == ["completed"] * 6)
    finally:
        stop(worker)
    stored = Experience.objects.filter(pk__in=[r.pk for r in rows])
    assert {(e.embedding_attempts, e.embedding_model, e.embedding_dimensions) for e in stored} == {
        (1, "openai:text-embedding-3-small", 384)
    }
    embedded = Event.objects.filter(tenant=tenant, type="experience.embedded")
    assert sorted(e.payload["experience"] for e in embedded) == sorted(r.public_id for r in rows)
    # The batch was requested twice (killed, then redelivered) and never a third time.
    expected = sorted([r.text for r in rows] + [r.problem_text for r in rows])
    batches = [sorted(b) for b in endpoint.embed_requests if set(b) & set(expected)]
    assert batches == [expected, expected]


def test_a_failing_embedder_marks_rows_failed_and_the_retry_command_recovers_them(tenant, endpoint):
    endpoint.mode = "fail"
    rows = create_batch(tenant, 3)
    worker = start_worker(
        endpoint,
        CTXAPP_EMBEDDING_MAX_RETRIES="2",
        CTXAPP_EMBEDDING_RETRY_BACKOFF="0.2",
        CTXAPP_EMBEDDING_CALL_RETRIES="0",  # the job's retries only (the embedder's own: test_embedding.py)
    )
    try:
        wait_until(lambda: statuses(rows) == ["failed"] * 3)
        assert len(endpoint.embed_requests) == 3  # the first attempt and two retries
        for experience in Experience.objects.filter(pk__in=[r.pk for r in rows]):
            assert "gave up after 3 attempts" in experience.embedding_error
            assert "HTTP 500" in experience.embedding_error
            assert experience.embedding is None
        failed_events = Event.objects.filter(tenant=tenant, type="experience.embedding_failed")
        assert failed_events.count() == 3

        endpoint.mode = "ok"
        call_command("reembed", "--failed", "--queue")
        wait_until(lambda: statuses(rows) == ["completed"] * 3)
    finally:
        stop(worker)
    for experience in Experience.objects.filter(pk__in=[r.pk for r in rows]):
        assert experience.embedding_error == "" and experience.embedding_attempts == 1
    assert (
        Event.objects.filter(tenant=tenant, type="experience.embedding_retried").get().payload["count"] == 3
    )


def test_a_finished_task_is_distilled_and_embedded_by_the_worker(tenant, endpoint):
    from memory.models import MessageRole
    from memory.services.sessions import (
        MessageInput,
        messages_append,
        session_create,
        task_create,
        task_update,
    )

    session = session_create(tenant=tenant, agent_external_id="agent-1", user_id="u1")
    messages_append(
        tenant=tenant,
        session=session,
        items=[
            MessageInput(role=MessageRole.USER, content="The nightly export fails with a timeout error"),
            MessageInput(role=MessageRole.ASSISTANT, content="Add an index on exports.created_at and rerun."),
        ],
    )
    task = task_create(tenant=tenant, session=session, input="Fix the nightly export timeout")
    worker = start_worker(endpoint)
    try:
        task_update(
            tenant=tenant, task=task, status="succeeded", output="Added the missing index; export runs"
        )
        wait_until(
            lambda: (
                Experience.objects.filter(source_task=task).count() == 2
                and set(
                    Experience.objects.filter(source_task=task).values_list("embedding_status", flat=True)
                )
                == {"completed"}
            )
        )
    finally:
        stop(worker)
    methods = set(Experience.objects.filter(source_task=task).values_list("extraction_method", flat=True))
    assert methods == {"direct", "pattern"}
    [distilled] = Event.objects.filter(tenant=tenant, type="memory.distilled")
    assert distilled.payload["path"] == "full" and distilled.payload["task"] == task.public_id


def test_a_worker_killed_mid_batch_is_recovered_by_the_job_sweep_within_its_bound(tenant, endpoint, tmp_path):
    """No broker redelivery here (the real settings: a one-hour visibility timeout): the job
    sweep alone finds the intent whose runner died and dispatches it again."""
    endpoint.mode = "hang"
    rows = create_batch(tenant, 2)
    sweep = 2.0
    env = {"DJANGO_SETTINGS_MODULE": "ctxapp.settings", "CTXAPP_JOB_SWEEP_SECONDS": str(sweep)}
    worker = start_worker(endpoint, **env)
    try:
        assert endpoint.request_arrived.wait(60), "the worker never called the embedder"
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        endpoint.release()
        killed = time.monotonic()
        schedule = str(tmp_path / "beat")  # pytest's own temporary directory, not a file left in /tmp
        worker = start_beat_worker(endpoint, schedule, **env)
        wait_until(lambda: statuses(rows) == ["completed"] * 2, timeout=60)
        recovered = time.monotonic() - killed
    finally:
        stop(worker)
    print(f"\nkilled mid-embedding: completed {recovered:.1f} s later (sweep every {sweep} s)")
    # Worker start-up (~5 s here) + at most two sweep periods + the embedding itself.
    assert recovered < 30
    assert Event.objects.filter(tenant=tenant, type="experience.embedded").count() == 2


def start_beat_worker(endpoint: FakeOpenAI, schedule: str, **extra: str) -> subprocess.Popen[bytes]:
    env = worker_env()
    env.update(
        {
            "CTXAPP_EMBEDDER": "openai",
            "CTXAPP_EMBEDDING_URL": endpoint.url,
            "CTXAPP_EMBEDDING_TIMEOUT": "60",
            **extra,
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ctxapp", "worker", "-B", "-s", schedule,
         "--loglevel", "warning", "--concurrency", "1", "--queues", f"{settings.QUEUE_PREFIX}-default",
         "--without-gossip", "--without-mingle", "--pool", "solo"],
        env=env, cwd=os.getcwd(),
        start_new_session=True,  # -B runs beat in a child process: stop() signals the whole group
    )  # fmt: skip
