"""The Redis-less broker (ctxapp/infra/broker.py) on a fresh database.

On first start the web server, the Celery worker and the scheduler all connect at once; each used
to create Kombu's tables itself and two of them collided on `CREATE SEQUENCE` (the worker died).
Proves: processes that connect together to a fresh database all succeed, and every message
they publish goes through the `ctxsqla` transport; a job whose worker was SIGKILLed after taking
it is delivered again after the visibility timeout, and not before; an acknowledged job leaves no
row behind, and a requeued one leaves exactly one.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from kombu import Connection

from ctxapp.infra import broker
from ctxapp.settings import _sqlalchemy_url


def _admin_conninfo() -> str:
    db = settings.DATABASES["default"]
    host = db.get("OPTIONS", {}).get("host") or db.get("HOST") or ""
    return psycopg.conninfo.make_conninfo(
        dbname="postgres", user=db.get("USER") or None, password=db.get("PASSWORD") or None,
        host=host or None, port=db.get("PORT") or None,
    )  # fmt: skip


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """A brand-new, empty database on the test server; its Kombu URL."""
    name = f"broker_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _sqlalchemy_url({**settings.DATABASES["default"], "NAME": name})
    finally:
        broker.Channel._engines.clear()  # drop this test's engines before the database goes
        with psycopg.connect(_admin_conninfo(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


STARTER = """
import sys, time
from kombu import Connection
import ctxapp.infra.broker  # registers the ctxsqla transport
url, start_at = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start_at - time.time()))
with Connection(url) as conn:
    queue = conn.SimpleQueue("ctxapp-broker-test")
    queue.put({"from": sys.argv[3]})
    queue.close()
"""


def test_processes_starting_together_on_a_fresh_database_all_connect(fresh_database: str) -> None:
    starters = 6
    start_at = time.time() + 3  # all past their imports by then, so their first queries collide
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, fresh_database, str(start_at), str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(starters)
    ]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]

    assert [proc.returncode for proc in procs] == [0] * starters, "\n".join(outputs)
    received = []
    with Connection(fresh_database) as conn:
        queue = conn.SimpleQueue("ctxapp-broker-test")
        while len(received) < starters:
            message = queue.get(timeout=5)
            received.append(message.payload["from"])
            message.ack()
        queue.close()
    assert sorted(received) == [str(n) for n in range(starters)]


def test_a_message_goes_through_the_sql_transport_on_a_fresh_database(fresh_database: str) -> None:
    received: list[Any] = []
    with Connection(fresh_database) as conn:
        queue = conn.SimpleQueue("ctxapp-broker-test")
        queue.put({"hello": "world"})
        message = queue.get(timeout=5)
        received.append(message.payload)
        message.ack()
        queue.close()
    assert received == [{"hello": "world"}]


TAKER = """
import os, signal, sys
from kombu import Connection
import ctxapp.infra.broker
with Connection(sys.argv[1]) as conn:
    message = conn.SimpleQueue("ctxapp-broker-test").get(timeout=5)
    print(message.payload["job"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # dies holding the job, never acknowledging it
"""


def rows(url: str) -> list[tuple[bool, str]]:
    name = url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(_admin_conninfo().replace("dbname=postgres", f"dbname={name}")) as conn:
        return [
            (visible, payload)
            for visible, payload in conn.execute("SELECT visible, payload FROM kombu_message")
        ]


def test_a_job_held_by_a_killed_worker_is_delivered_again_after_the_visibility_timeout(
    fresh_database: str,
) -> None:
    with Connection(fresh_database, transport_options={"visibility_timeout": 5}) as conn:
        queue = conn.SimpleQueue("ctxapp-broker-test")
        queue.put({"job": "embed-42"})
        taker = subprocess.run(
            [sys.executable, "-c", TAKER, fresh_database], capture_output=True, text=True, timeout=60
        )
        taken_by = time.monotonic()  # the job was taken before the taker exited
        assert taker.returncode == -9 and taker.stdout.strip() == "embed-42", taker.stderr

        with pytest.raises(queue.Empty):  # still within its visibility timeout: nobody else gets it
            queue.get(timeout=0.5)
        again = None
        deadline = time.monotonic() + 60
        while again is None:
            assert time.monotonic() < deadline, "the job was never delivered again"
            try:
                again = queue.get(timeout=0.5)
            except queue.Empty:
                continue
        assert time.monotonic() - taken_by >= 4.0  # not before the 5 s timeout (less a poll interval)
        assert again.payload == {"job": "embed-42"}
        again.ack()
        with pytest.raises(queue.Empty):  # acknowledged: gone for good
            queue.get(timeout=0.5)
        queue.close()
    assert rows(fresh_database) == []


def test_acknowledged_jobs_leave_no_rows_and_a_requeued_job_is_there_once(fresh_database: str) -> None:
    with Connection(fresh_database) as conn:
        queue = conn.SimpleQueue("ctxapp-broker-test")
        for n in range(3):
            queue.put({"job": n})
        for _ in range(2):
            queue.get(timeout=5).ack()
        assert len(rows(fresh_database)) == 1  # only the job nobody took yet

        last = queue.get(timeout=5)
        last.requeue()  # a worker hands it back (warm shutdown)
        assert [visible for visible, _ in rows(fresh_database)] == [True]
        assert queue.get(timeout=5).payload == {"job": 2}
        queue.close()


def test_acks_from_another_thread_while_the_consumer_polls(fresh_database: str) -> None:
    """Celery acknowledges from its result-handler thread while its consumer thread polls."""
    import queue as stdlib_queue
    import threading

    jobs = 300
    to_ack: stdlib_queue.Queue[Any] = stdlib_queue.Queue()
    errors: list[BaseException] = []

    def acknowledger() -> None:
        while (message := to_ack.get()) is not None:
            try:
                message.ack()
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

    with Connection(fresh_database) as conn:
        queue = conn.SimpleQueue("ctxapp-broker-test")
        for n in range(jobs):
            queue.put({"job": n})
        thread = threading.Thread(target=acknowledger)
        thread.start()
        received = []
        try:
            while len(received) < jobs:
                message = queue.get(timeout=10)
                received.append(message.payload["job"])
                to_ack.put(message)
        finally:
            to_ack.put(None)
            thread.join(30)
        queue.close()
    assert errors == []
    assert received == list(range(jobs))
    assert rows(fresh_database) == []
