"""`ctxapp` refuses bad hosts, ports and misplaced databases clearly: one line, exit 2, no traceback."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.test_cli import _free_port, assert_refused, clean_env, ctxapp


def test_a_port_out_of_range_is_refused_without_a_traceback(tmp_path: Path) -> None:
    for args in (["up", "--port", "99999"], ["web", "--port", "70000"]):
        result = ctxapp(args, clean_env(tmp_path), tmp_path)
        assert_refused(result, "is not a TCP port", "1 to 65535")
        assert "OverflowError" not in result.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created


def test_a_host_that_does_not_resolve_is_not_reported_as_a_busy_port(tmp_path: Path) -> None:
    result = ctxapp(["up", "--host", "999.1.1.1", "--port", str(_free_port())], clean_env(tmp_path), tmp_path)
    assert_refused(result, "Cannot resolve the host '999.1.1.1'", "--host 127.0.0.1")
    assert "in use" not in result.stderr


def test_an_address_of_another_machine_is_not_reported_as_a_busy_port(tmp_path: Path) -> None:
    result = ctxapp(["up", "--host", "192.0.2.1", "--port", str(_free_port())], clean_env(tmp_path), tmp_path)
    assert_refused(result, "Cannot bind 192.0.2.1:", "an address of this machine")
    assert "in use" not in result.stderr


def test_a_busy_port_is_still_reported_as_busy(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = ctxapp(["up", "--port", str(port)], clean_env(tmp_path), tmp_path)
    assert_refused(result, f"Port {port} on 127.0.0.1 is already in use")


def _without_data_dir(tmp_path: Path) -> dict[str, str]:
    env = clean_env(tmp_path)
    del env["CTXAPP_DATA_DIR"]
    return env


def test_manage_from_a_directory_without_a_project_refuses_and_creates_nothing(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = ctxapp(["manage", "createsuperuser", "--noinput"], _without_data_dir(tmp_path), elsewhere)
    assert_refused(result, "No ctxapp database in", "CTXAPP_DATA_DIR=")
    assert not (elsewhere / ".ctxapp").exists()  # no new empty database


def test_a_subdirectory_of_a_project_finds_the_project_data_directory(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".ctxapp").mkdir(parents=True)
    deep = project / "src" / "agents"
    deep.mkdir(parents=True)
    for cwd in (project, deep):
        result = ctxapp(["config", "--json"], _without_data_dir(tmp_path), cwd)
        assert result.returncode == 0, result.stderr
        # Found, not set: `ctxapp config` does not claim it came from the environment.
        assert json.loads(result.stdout)["CTXAPP_DATA_DIR"] == {
            "value": str(project / ".ctxapp"),
            "source": "found: the nearest .ctxapp directory",
        }
    # An explicit setting always wins.
    env = clean_env(tmp_path, CTXAPP_DATA_DIR=str(tmp_path / "mine"))
    explicit = json.loads(ctxapp(["config", "--json"], env, deep).stdout)["CTXAPP_DATA_DIR"]
    assert explicit == {"value": str(tmp_path / "mine"), "source": "environment"}


@pytest.fixture
def empty_database_url() -> str:
    """A database on the test server that exists but never had ctxapp's migrations applied."""
    db = settings.DATABASES["default"]
    host = db.get("OPTIONS", {}).get("host") or db["HOST"]
    name = f"ctxapp_empty_{uuid.uuid4().hex[:8]}"

    def url(database: str) -> str:
        if db.get("PORT"):
            return f"postgresql://{db['USER']}@{host}:{db['PORT']}/{database}"
        return f"postgresql://{db['USER']}@/{database}?host={host}"

    admin = url("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield url(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_manage_refuses_a_database_without_the_schema(tmp_path: Path, empty_database_url: str) -> None:
    env = clean_env(tmp_path, DATABASE_URL=empty_database_url)
    result = ctxapp(["manage", "createsuperuser", "--noinput", "--username", "x"], env, tmp_path)
    assert_refused(result, "has no ctxapp schema yet", "ctxapp manage migrate")
    # The commands that make or inspect the schema still run.
    shown = ctxapp(["manage", "showmigrations", "memory"], env, tmp_path)
    assert shown.returncode == 0 and "[ ] 0001_squashed_0022_redis_engines" in shown.stdout, shown.stderr
