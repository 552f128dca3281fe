"""Shared fixtures. Tenant A and tenant B must never see each other's data.

Everything is real: the embedded PostgreSQL + pgvector started by ctxapp/settings_test.py,
Redis as broker and channel layer, and (fixture `celery_worker`) a real Celery worker process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.test import APIClient

import ctxapp.celery  # noqa: F401  (the Celery app, as every process's entry point loads it)
from memory.models import ApiKey, Tenant
from memory.services.tenancy import api_key_create
from tests import environment


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Find (or, as root, install) what the selected tests need before any runs: tests/environment.py."""
    environment.require_for(items)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The test database, dropped at the end without "is being accessed by other users".

    Servers and workers that tests start as subprocesses may leave a backend behind for a moment
    after they exit; end those before pytest-django drops the database.

    Tests that call `jobs.job_run` play the worker, so they load what a worker loads: the task
    modules that register each job kind (memory/tasks/jobs.py), whichever test runs first.
    """
    import memory.tasks.jobs  # noqa: F401  # lazy: django-setup

    yield
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def tenant_a(db: None) -> Tenant:
    return Tenant.objects.create(name="Alice's team", slug="alice")


@pytest.fixture
def tenant_b(db: None) -> Tenant:
    return Tenant.objects.create(name="Bob's team", slug="bob")


def _client_for(tenant: Tenant, scopes: list[str] | None = None) -> APIClient:
    key, secret = api_key_create(tenant=tenant, name="test", scopes=scopes)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    client.api_key = key  # type: ignore[attr-defined]
    client.secret = secret  # type: ignore[attr-defined]
    return client


@pytest.fixture
def api_a(tenant_a: Tenant) -> APIClient:
    """Alice's API client (read + write)."""
    return _client_for(tenant_a)


@pytest.fixture
def api_b(tenant_b: Tenant) -> APIClient:
    """Bob's API client: must never see Alice's stuff."""
    return _client_for(tenant_b)


@pytest.fixture
def alice(api_a: APIClient) -> Iterator[Any]:
    """Alice's Python client (ctxapp.client), talking to this process's Django in the test's transaction."""
    from ctxapp.client import Client
    from tests.helpers import in_process_transport

    with (
        in_process_transport() as transport,
        Client("http://testserver", api_a.secret, retries=0, transport=transport) as client,
    ):
        yield client


@pytest.fixture
def make_client() -> Any:
    return _client_for


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


def key_of(client: APIClient) -> ApiKey:
    return client.api_key  # type: ignore[attr-defined,no-any-return]


def worker_env() -> dict[str, str]:
    """The environment of a subprocess (worker, server) that must use the test database."""
    db = settings.DATABASES["default"]
    host = db.get("OPTIONS", {}).get("host") or db.get("HOST") or ""
    name = db["NAME"]
    user = db.get("USER") or "postgres"
    password = db.get("PASSWORD") or ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    if host.startswith("/"):
        url = f"postgresql://{user}:{password}@/{name}?host={host}"
    else:
        url = f"postgresql://{user}:{password}@{host}{port}/{name}"
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "ctxapp.settings",
            "DATABASE_URL": url,
        }
    )
    env.pop("CTXAPP_EMBEDDED_DATABASE_URL", None)
    return env


def wait_for_worker(proc: subprocess.Popen[bytes], hostname: str, timeout: float = 60.0) -> None:
    """Return once the worker `hostname` answers a control ping: it is connected and consuming."""
    from ctxapp.celery import app

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the Celery worker exited during start-up (code {proc.returncode})"
        if app.control.ping(destination=[hostname], timeout=0.5):
            return
    raise AssertionError(f"the Celery worker {hostname} did not answer a ping within {timeout:.0f} s")


@pytest.fixture(scope="session")
def web_server(django_db_setup: None) -> Iterator[str]:
    """One ctxapp web server (uvicorn, the ASGI app) on the test database and the run's Redis, for
    the whole run; tests that need other settings start their own. Each test brings its own data
    (transactional_db flushes it after the test), so the server keeps no state a test relies on."""
    from tests.dashboard.live_server import uvicorn_server

    with uvicorn_server(worker_env()) as base:
        yield base


@pytest.fixture
def celery_worker(transactional_db: None) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker process on the test database and this run's Redis queue."""
    queue = f"{settings.QUEUE_PREFIX}-default"
    hostname = f"test-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ctxapp", "worker", "--loglevel", "warning", "-n", hostname,
         "--concurrency", "1", "--queues", queue, "--without-gossip", "--without-mingle", "--pool", "solo"],
        env=worker_env(),
    )  # fmt: skip
    try:
        wait_for_worker(proc, hostname)
        yield proc
    finally:  # also when the worker never came up: no process outlives the test
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture
def broker_down() -> Iterator[None]:
    """Celery's producer pointed at a port where nothing listens (a real refused connection)."""
    from ctxapp.celery import app

    # Celery may swap `app.conf` for its finalized settings object during the test, so the URLs are
    # restored on whatever `app.conf` is at the end (monkeypatch would restore the stale object).
    saved_urls = {"broker_url": app.conf.broker_url, "broker_write_url": app.conf.get("broker_write_url")}
    app.conf.broker_url = app.conf.broker_write_url = "redis://127.0.0.1:1/0"
    saved = app._pool
    app._pool = None
    app.amqp._producer_pool = None
    yield
    if app._pool is not None:
        app._pool.force_close_all()
    for name, value in saved_urls.items():
        setattr(app.conf, name, value)
    app._pool = saved
    app.amqp._producer_pool = None
