"""Many processes, one truth: two `ctxapp web`, two `ctxapp worker` and one `ctxapp beat` on one
PostgreSQL (the test database) and Redis, started as docs/production.md "Many processes" says.

What a user of web B must see of what was written through web A, at once or once the workers ran:
- writes go through either web process, and each reads the other's;
- a message appended through A is found through B by its words at once and by meaning once
  embedded (B's per-process scope cache was warmed first: it must not answer from it);
- a session erased through A is gone from B's search at once; a message whose embedding failed,
  re-embedded by the `reembed --messages --failed` command, is found by meaning through B;
- a dashboard websocket connected to B receives what was appended through A;
- every job runs exactly once across the two workers, and both workers ran jobs.

The embedder is the one remote double: a local OpenAI-compatible server whose vectors are bags of
"concepts" (a few synonyms share one), so a query can match a message by meaning and not by word.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client as DjangoClient
from websockets.sync.client import connect as ws_connect

from memory.models import Event, Experience, JobIntent, Membership, MembershipRole, Task, Tenant
from memory.services.tenancy import api_key_create
from tests.conftest import wait_for_worker, worker_env
from tests.dashboard.live_server import free_port

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

START_DEADLINE = 60.0  # five Django processes starting at once on 2 shared cores
JOB_DEADLINE = 40.0
SYNONYMS = {"automobile": "car", "vehicle": "car", "airship": "zeppelin", "dirigible": "zeppelin"}


def concept_vector(text: str) -> list[float]:
    """A unit vector: one dimension per concept of the text (a word, or the concept its synonym names)."""
    vector = np.zeros(384, dtype=np.float64)
    for word in re.findall(r"[a-z]+", text.lower()):
        concept = SYNONYMS.get(word, word)
        vector[int(hashlib.sha1(concept.encode()).hexdigest(), 16) % 383 + 1] += 1.0
    vector[0] += 0.01  # never the zero vector
    return (vector / np.linalg.norm(vector)).tolist()


class FakeEmbeddings:
    """An OpenAI-compatible /v1/embeddings on 127.0.0.1. A request holding a text that contains a
    word of `refuse` is answered 400 (a permanent error: the messages become `failed`)."""

    def __init__(self) -> None:
        self.refuse: set[str] = set()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                texts = list(body["input"])
                if any(word in text.lower() for text in texts for word in owner.refuse):
                    return self._send(400, {"error": {"message": "input refused"}})
                data = [{"index": i, "embedding": concept_vector(t)} for i, t in enumerate(texts)]
                return self._send(200, {"data": data, "model": body["model"]})

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


class Installation:
    """The five processes, each in its own process group (stopped together at the end)."""

    def __init__(self, env: dict[str, str], work: Path) -> None:
        self.env, self.work = env, work
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports = {"a": free_port(), "b": free_port()}
        self.workers = {f"w{i}": f"drill{i}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}" for i in (1, 2)}

    def ctxapp(self, name: str, *args: str) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "ctxapp.cli", *args],
            env=self.env, cwd=self.work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def start(self) -> None:
        for name, port in self.ports.items():
            self.ctxapp(f"web-{name}", "web", "--host", "127.0.0.1", "--port", str(port))
        for name, node in self.workers.items():
            self.ctxapp(name, "worker", "--name", node)
        self.ctxapp("beat", "beat")
        for name in self.ports:
            wait_until(lambda name=name: self.healthy(name), START_DEADLINE, f"web {name} to answer")  # type: ignore[misc]
        for name, node in self.workers.items():
            wait_for_worker(self.procs[name], node, timeout=START_DEADLINE)

    def healthy(self, name: str) -> bool:
        assert self.procs[f"web-{name}"].poll() is None, self.log(f"web-{name}")
        try:
            return httpx.get(f"{self.base(name)}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def base(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


@pytest.fixture
def embeddings() -> Iterator[FakeEmbeddings]:
    server = FakeEmbeddings()
    yield server
    server.close()


@pytest.fixture
def installation(
    transactional_db: None, embeddings: FakeEmbeddings, tmp_path: Path
) -> Iterator[Installation]:
    env = {
        **worker_env(),
        "CTXAPP_DATA_DIR": str(tmp_path / "data"),
        "CTXAPP_EMBEDDER": "openai",
        "CTXAPP_EMBEDDING_URL": embeddings.url,
        "CTXAPP_EMBEDDING_MODEL": "drill-concepts",
        "CTXAPP_WORKER_CONCURRENCY": "2",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    system = Installation(env, tmp_path)
    try:
        system.start()
        yield system
    finally:  # also when one never came up: no process outlives the test
        system.stop()


def hits(client: httpx.Client, query: str, **scope: str) -> list[dict[str, Any]]:
    body: dict[str, Any] = {"query": query, "kinds": ["message"]}
    if scope:
        body["scope"] = scope
    response = client.post("/api/v1/memory/search", json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["results"])


def texts_of(results: list[dict[str, Any]]) -> list[str]:
    return [r["text"] for r in results]


def append(client: httpx.Client, session: str, text: str) -> None:
    response = client.post(f"/api/v1/sessions/{session}/messages", json={"role": "user", "content": text})
    assert response.status_code == 201, response.text


def index_status(client: httpx.Client) -> dict[str, int]:
    return dict(client.get("/api/v1/memory/index").json())


def dashboard_cookie(tenant: Tenant) -> str:
    user = get_user_model().objects.create_user(username="drill-operator", password="drill-password-1")
    Membership.objects.create(user=user, tenant=tenant, role=MembershipRole.OPERATOR)
    browser = DjangoClient()
    browser.force_login(user)
    return str(browser.cookies["sessionid"].value)


def check_writes_through_both(a: httpx.Client, b: httpx.Client) -> tuple[str, str]:
    # Writes through both web processes; each reads what the other wrote.
    session = a.post("/api/v1/sessions", json={"agent": "drill"}).json()["id"]
    other = b.post("/api/v1/sessions", json={"agent": "drill"}).json()["id"]
    append(a, session, "We keep the invoices in the blue cabinet.")
    append(b, session, "The quarterly review moved to Thursday.")
    append(b, other, "The parrot named Kiwi talks at dawn.")
    assert [m["content"] for m in a.get(f"/api/v1/sessions/{session}/messages").json()["items"]] == [
        "We keep the invoices in the blue cabinet.",
        "The quarterly review moved to Thursday.",
    ]
    assert b.get(f"/api/v1/sessions/{other}").status_code == 200
    assert a.get(f"/api/v1/sessions/{other}").status_code == 200
    return session, other


def check_search_is_fresh_across_processes(a: httpx.Client, b: httpx.Client, session: str) -> None:
    # B's scope caches warmed (tenant-wide and the one session), then A appends.
    assert texts_of(hits(b, "cabinet")) == ["We keep the invoices in the blue cabinet."]
    assert hits(b, "automobile", session=session) == []
    word = f"w{uuid.uuid4().hex[:8]}"
    car = f"My car {word} would not start this morning."
    append(a, session, car)
    assert car in texts_of(hits(b, word)), "B answered from a stale scope cache (by words)"
    assert car in texts_of(hits(b, word, session=session))
    wait_until(
        lambda: car in texts_of(hits(b, "automobile", session=session)),
        JOB_DEADLINE,
        "B to find the message by meaning once embedded",
    )
    assert car in texts_of(hits(b, "vehicle"))


def check_dashboard_on_b_sees_writes_through_a(
    a: httpx.Client, installation: Installation, cookie: str, session: str
) -> None:
    # A dashboard connected to B gets what is appended through A.
    with ws_connect(
        f"ws://127.0.0.1:{installation.ports['b']}/ws/dashboard/?tenant=drill&page=session&session={session}",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": installation.base("b")},
        open_timeout=10,
    ) as ws:
        live = f"live {uuid.uuid4().hex[:8]} from web A"
        append(a, session, live)
        deadline = time.monotonic() + 15
        frames: list[str] = []
        while not any(live in f for f in frames):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"the dashboard on B never showed {live!r}: {frames}"
            with contextlib.suppress(TimeoutError):
                frames.append(str(ws.recv(timeout=remaining)))


def check_erasure_is_seen_at_once(a: httpx.Client, b: httpx.Client, other: str) -> None:
    # An erasure through A is seen by B at once.
    assert texts_of(hits(b, "parrot")) == ["The parrot named Kiwi talks at dawn."]
    assert a.delete(f"/api/v1/sessions/{other}").status_code == 204
    assert hits(b, "parrot") == [], "B still finds an erased session's message"
    assert b.get(f"/api/v1/sessions/{other}").status_code == 404


def check_reembedding_is_seen(
    a: httpx.Client, b: httpx.Client, installation: Installation, embeddings: FakeEmbeddings, session: str
) -> None:
    # A failed embedding, re-embedded by a one-off process, is found by meaning through B.
    wait_until(lambda: index_status(b)["pending"] == 0, JOB_DEADLINE, "the index to drain")
    embeddings.refuse = {"zeppelin"}
    zeppelin = "The zeppelin hangar roof leaks when it rains."
    append(a, session, zeppelin)
    wait_until(lambda: index_status(b)["failed"] == 1, JOB_DEADLINE, "the embedding to fail")
    assert zeppelin not in texts_of(hits(b, "airship", session=session))
    embeddings.refuse = set()
    # `ctxapp manage reembed` itself refuses a database without migration records, as the test
    # database is (created from the models): the same command through django-admin.
    reembed = subprocess.run(
        [sys.executable, "-m", "django", "reembed", "--messages", "--failed"],
        env=installation.env, cwd=installation.work, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert reembed.returncode == 0, reembed.stdout + reembed.stderr
    assert zeppelin in texts_of(hits(b, "airship", session=session)), "B missed the re-embedding"
    assert zeppelin in texts_of(hits(a, "dirigible"))


def submit_jobs_through_both(a: httpx.Client, b: httpx.Client, session: str) -> tuple[list[str], list[str]]:
    # Jobs written through both web processes run once across the two workers.
    tasks, experiences = [], []
    for n in range(6):
        client = (a, b)[n % 2]
        problem = {"problem": f"drill {n} stalls", "solution": f"restart service {n}"}
        made = client.post("/api/v1/experiences", json=problem)
        assert made.status_code in (200, 201), made.text
        experiences.append(made.json()["id"])
        started = {"session": session, "input": f"fix {n}", "metadata": {"distill": "full"}}
        task = client.post("/api/v1/tasks", json=started).json()
        finished = {"status": "succeeded", "output": f"Fixed by pinning {n}."}
        done = (b, a)[n % 2].patch(f"/api/v1/tasks/{task['id']}", json=finished)
        assert done.status_code == 200, done.text
        tasks.append(task["id"])
    return tasks, experiences


def check_jobs_ran_once(
    installation: Installation, tenant: Tenant, tasks: list[str], experiences: list[str]
) -> None:
    def caught_up() -> bool:
        connection.close()  # a fresh snapshot each poll
        return (
            not JobIntent.objects.exclude(status="done").exists()
            and not Experience.objects.filter(tenant=tenant).exclude(embedding_status="completed").exists()
            and Event.objects.filter(tenant=tenant, type="memory.distilled", payload__path="full").count()
            >= len(tasks)
        )

    wait_until(caught_up, JOB_DEADLINE, "every job to run")
    embedded = Event.objects.filter(tenant=tenant, type="experience.embedded").values_list(
        "payload__experience", flat=True
    )
    distilled_experiences = set(Experience.objects.filter(tenant=tenant).values_list("public_id", flat=True))
    assert sorted(embedded) == sorted(distilled_experiences), "an experience was embedded twice or never"
    assert set(experiences) <= distilled_experiences
    full = Event.objects.filter(tenant=tenant, type="memory.distilled", payload__path="full").values_list(
        "payload__task", flat=True
    )
    assert sorted(full) == sorted(tasks), "a task was distilled twice or never"
    assert Task.objects.filter(public_id__in=tasks, status="succeeded").count() == len(tasks)
    assert not JobIntent.objects.filter(attempts__gt=1).exists(), "a job ran more than once"

    from ctxapp.celery import app

    stats = app.control.inspect(destination=list(installation.workers.values()), timeout=5).stats() or {}
    ran = {node: sum(stats.get(node, {}).get("total", {}).values()) for node in installation.workers.values()}
    assert all(ran.values()), f"a worker ran no job: {ran}"


def test_two_web_processes_and_two_workers_serve_one_truth(
    installation: Installation, embeddings: FakeEmbeddings
) -> None:
    tenant = Tenant.objects.create(name="Drill", slug="drill")
    _, secret = api_key_create(tenant=tenant, name="drill")
    cookie = dashboard_cookie(tenant)
    headers = {"Authorization": f"Bearer {secret}"}
    with (
        httpx.Client(base_url=installation.base("a"), headers=headers, timeout=30) as a,
        httpx.Client(base_url=installation.base("b"), headers=headers, timeout=30) as b,
    ):
        session, other = check_writes_through_both(a, b)
        check_search_is_fresh_across_processes(a, b, session)
        check_dashboard_on_b_sees_writes_through_a(a, installation, cookie, session)
        check_erasure_is_seen_at_once(a, b, other)
        check_reembedding_is_seen(a, b, installation, embeddings, session)
        tasks, experiences = submit_jobs_through_both(a, b, session)
    check_jobs_ran_once(installation, tenant, tasks, experiences)
