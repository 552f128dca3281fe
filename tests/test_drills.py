"""Fault drills: jobs survive a broker outage and a killed worker.

Redis drill: our own Redis engine (the server ctxapp.infra.embedded_redis runs) on a spare port
with no persistence, so a restart also loses every queued message, a real Celery worker with beat
(`-B`) on it, and writes through the API before, during and after BROKER_OUTAGE_SECONDS without
Redis. Worker drill: the suite's Redis engine, the worker SIGKILLed under load and started again
later.

Each drill then asserts: no write answered 5xx, and every embedding, full distillation and
summarisation implied by an acknowledged write ran exactly once (one `experience.embedded` per
experience, one full `memory.distilled` per task, summaries folding contiguous, non-overlapping
ranges, every job intent done). Waits poll under a deadline.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from ctxapp.infra import embedded_redis
from memory.models import (
    BudgetSample,
    Event,
    Experience,
    JobIntent,
    ModelProfile,
    Session,
    Summary,
    Task,
    Tenant,
)
from memory.services.context import context_build
from memory.services.sessions import MessageInput, messages_append, session_create
from tests.conftest import _client_for, worker_env

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

BROKER_OUTAGE_SECONDS = float(os.environ.get("CTXAPP_DRILL_OUTAGE_SECONDS", "30"))  # the issue: 30 s
WORKER_DOWN_SECONDS = 10.0
RECOVERY_DEADLINE_SECONDS = 60.0
MAX_ROUNDS = 25  # rounds of writes while the broker or worker is down (each: 4-5 writes)
# The worker's sweep runs every second and re-dispatches what was not taken within 3 s, so
# recovery is bounded by seconds, not the production defaults (15 s / 60 s).
DRILL_ENV = {"CTXAPP_JOB_SWEEP_SECONDS": "1", "CTXAPP_JOB_REDISPATCH_SECONDS": "3"}


def spare_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.2)
    return time.monotonic() - started


class RedisServer:
    def __init__(self) -> None:
        self.port = spare_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [embedded_redis.server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(self.answers, 10, "redis-server to start")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)  # a crash: nothing saved, every queued job lost
            self.proc.wait(10)


def point_publisher_at(broker_url: str) -> Callable[[], None]:
    """Make this process's Celery producer publish to `broker_url`; returns the undo."""
    from ctxapp.celery import app

    saved = (app.conf.broker_url, app.conf.broker_write_url, app._pool)
    app.conf.broker_url = app.conf.broker_write_url = broker_url
    app._pool = None
    app.amqp._producer_pool = None

    def undo() -> None:
        if app._pool is not None:
            app._pool.force_close_all()
        (app.conf.broker_url, app.conf.broker_write_url, app._pool) = saved
        app.amqp._producer_pool = None

    return undo


BEAT_SCHEDULES: dict[int, Path] = {}  # worker pid -> its beat schedule's directory


def start_worker(env_extra: dict[str, str], *, drop: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    from django.conf import settings

    env = worker_env()
    env.update({**DRILL_ENV, **env_extra})
    for name in drop:
        env.pop(name, None)
    schedule = Path(tempfile.mkdtemp(prefix="ctxapp-drill-")) / "beat"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ctxapp", "worker", "-B", "-s", str(schedule),
         "--loglevel", "warning", "--concurrency", "1", "--pool", "solo",
         "--queues", f"{settings.QUEUE_PREFIX}-default", "--without-gossip", "--without-mingle"],
        env=env, cwd=os.getcwd(),
        start_new_session=True,  # -B runs beat in a child process: signal the whole group
    )  # fmt: skip
    BEAT_SCHEDULES[proc.pid] = schedule.parent  # removed by stop_worker
    return proc


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """Stop the worker and its embedded beat (its process group), whatever state it is in."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # beat too, if the worker left it behind
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    schedule_dir = BEAT_SCHEDULES.pop(proc.pid, None)
    if schedule_dir is not None:
        shutil.rmtree(schedule_dir, ignore_errors=True)


class Load:
    """Writes through the API that each imply jobs: an experience (embedding), a task that
    succeeds (full distillation, whose experiences are embedded too), a context build over the
    summarisation threshold (summarisation). Records every status code."""

    def __init__(self, tenant: Tenant, api: APIClient) -> None:
        self.tenant, self.api = tenant, api
        self.statuses: list[tuple[str, int]] = []
        self.seconds: list[float] = []  # each round's duration (four to five writes)
        self.sessions: list[Session] = []
        self.tasks: list[str] = []
        session = self._history_session()
        probe = context_build(tenant=tenant, session=session, next_input="what next?", model_name="gpt-4o")
        BudgetSample.objects.filter(public_id=probe.build_id).delete()
        limit = int(probe.budget["demand_tokens"] / 0.9)  # the next prompt at ~90 %: over the threshold
        ModelProfile.objects.create(
            tenant=tenant, name="small", input_limit=limit, output_limit=20, tokenizer="o200k_base"
        )
        self.spare = [session, *(self._history_session() for _ in range(7))]

    def _history_session(self) -> Session:
        session = session_create(tenant=self.tenant, agent_external_id="drill", model_name="small")
        items = []
        for i in range(12):
            items.append(MessageInput(role="user", content=f"Step {i}: we decided to use option {i}. " * 3))
            items.append(MessageInput(role="assistant", content=f"Done with step {i}; error rate {i}%."))
        messages_append(tenant=self.tenant, session=session, items=items)
        return session

    def record(self, what: str, response: Any) -> Any:
        self.statuses.append((what, response.status_code))
        return response

    def timed(self, call: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return call()
        finally:
            self.seconds.append(time.monotonic() - started)

    def round(self, n: int) -> None:
        word = uuid.uuid4().hex[:10]
        self.record(
            "experience",
            self.api.post(
                "/api/v1/experiences",
                {"problem": f"drill {n} {word} stalls", "solution": f"restart {word} service {n}"},
                format="json",
            ),
        )
        session = self.api.post("/api/v1/sessions", {"agent": f"agent-{n}"}, format="json").json()
        task = self.record(
            "task",
            self.api.post(
                "/api/v1/tasks",
                {"session": session["id"], "input": f"fix {word}", "metadata": {"distill": "full"}},
                format="json",
            ),
        ).json()
        self.record(
            "task succeeded",
            self.api.patch(
                f"/api/v1/tasks/{task['id']}",
                {"status": "succeeded", "output": f"Fixed {word} by pinning version {n}."},
                format="json",
            ),
        )
        self.tasks.append(task["id"])
        if n % 3 == 0 and self.spare:
            history = self.spare.pop()
            self.sessions.append(history)
            built = self.record(
                "context build",
                self.api.post(
                    f"/api/v1/sessions/{history.public_id}/context", {"input": "next?"}, format="json"
                ),
            )
            assert built.json()["summarisation"]["queued"] is True

    def run_for(self, seconds: float, start: int, *, max_rounds: int = 1_000) -> int:
        """Rounds of writes for `seconds` (at most `max_rounds`, then reads of /readyz)."""
        n, deadline = start, time.monotonic() + seconds
        while time.monotonic() < deadline:
            if n - start >= max_rounds:  # bounded backlog: the drill measures recovery, not throughput
                assert self.api.get("/readyz").status_code == 200
                continue
            self.timed(lambda n=n: self.round(n))  # type: ignore[misc]
            n += 1
        return n

    # -- what must hold once the jobs caught up -------------------------------------------------

    def all_jobs_ran(self) -> bool:
        connection.close()  # a fresh snapshot each poll
        self.last_state = list(JobIntent.objects.values_list("kind", "status", "attempts", "error"))
        return (
            not JobIntent.objects.exclude(status="done").exists()
            and not Experience.objects.filter(tenant=self.tenant)
            .exclude(embedding_status="completed")
            .exists()
        )

    def assert_exactly_once(self) -> None:
        assert [s for s in self.statuses if s[1] >= 500] == [], "a write answered 5xx"
        assert {code for what, code in self.statuses if what == "experience"} <= {200, 201}
        embedded = list(
            Event.objects.filter(tenant=self.tenant, type="experience.embedded").values_list(
                "payload__experience", flat=True
            )
        )
        experiences = list(Experience.objects.filter(tenant=self.tenant).values_list("public_id", flat=True))
        assert sorted(embedded) == sorted(experiences), "an experience was embedded twice or never"
        full = list(
            Event.objects.filter(
                tenant=self.tenant, type="memory.distilled", payload__path="full"
            ).values_list("payload__task", flat=True)
        )
        assert sorted(full) == sorted(self.tasks), "a task was distilled twice or never"
        assert Task.objects.filter(public_id__in=self.tasks, status="succeeded").count() == len(self.tasks)
        for session in self.sessions:
            summaries = list(Summary.objects.filter(session=session).order_by("folded_from_seq"))
            assert summaries, f"{session.public_id} was never summarised"
            assert [s.folded_from_seq for s in summaries] == [1] + [
                s.covers_up_to_seq + 1 for s in summaries[:-1]
            ]
            created = Event.objects.filter(session=session, type="summary.created").count()
            assert created == len(summaries), "a summarisation ran twice"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def test_a_redis_outage_under_load_loses_no_job_and_runs_none_twice(redis_server: RedisServer) -> None:
    tenant = Tenant.objects.create(name="Drill", slug="drill")
    load = Load(tenant, _client_for(tenant))
    undo = point_publisher_at(redis_server.url)
    worker = start_worker({"REDIS_URL": redis_server.url})
    try:
        n = load.run_for(3.0, 0, max_rounds=5)
        redis_server.stop()
        before = len(load.seconds)
        n = load.run_for(BROKER_OUTAGE_SECONDS, n, max_rounds=MAX_ROUNDS)
        during = sorted(load.seconds[before:])
        # A publish to a Redis that is down fails at once; the request does not wait for it.
        assert during[len(during) // 2] < 3.0, f"rounds took {during} s with the broker down"
        readyz = load.api.get("/readyz").json()
        assert readyz["status"] == "degraded" and readyz["checks"]["broker"]["jobs_waiting"] > 0
        redis_server.start()
        load.run_for(2.0, n, max_rounds=5)
        try:
            took = wait_until(load.all_jobs_ran, RECOVERY_DEADLINE_SECONDS, "every job to run")
        except AssertionError:
            print([s for s in load.last_state if s[1] != "done"])
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pid, state, wait_event_type, wait_event, left(query, 200) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                for row in cursor.fetchall():
                    print("PG", row)
            raise
        print(
            f"\nredis drill: {len(load.statuses)} writes, {len(during)} rounds during the outage "
            f"(median {during[len(during) // 2]:.2f} s), caught up {took:.1f} s after the last write"
        )
    finally:
        stop_worker(worker)
        undo()
    load.assert_exactly_once()


def test_a_worker_killed_under_load_loses_no_job_and_runs_none_twice() -> None:
    tenant = Tenant.objects.create(name="Drill", slug="drill")
    load = Load(tenant, _client_for(tenant))
    worker = start_worker({})
    try:
        n = load.run_for(5.0, 0, max_rounds=10)
        os.killpg(worker.pid, signal.SIGKILL)  # mid-load, maybe mid-job (and its embedded beat)
        stop_worker(worker)  # reaps it and removes its beat schedule
        n = load.run_for(WORKER_DOWN_SECONDS, n, max_rounds=MAX_ROUNDS)
        worker = start_worker({})
        load.run_for(2.0, n, max_rounds=5)
        took = wait_until(load.all_jobs_ran, RECOVERY_DEADLINE_SECONDS, "every job to run")
        print(f"\nworker drill: {len(load.statuses)} writes, caught up {took:.1f} s after the last write")
    finally:
        stop_worker(worker)
    load.assert_exactly_once()
