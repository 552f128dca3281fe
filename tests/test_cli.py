"""The `ctxapp` command's refusals: each a clear message naming what to fix, exit code 2, no traceback.

`ctxapp up` itself, end to end, is in test_cli_up.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[1]


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CTXAPP_")
        and name not in {"REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        {
            "CTXAPP_DATA_DIR": str(tmp_path / "data"),
            "CTXAPP_ENV_FILE": str(tmp_path / "none.env"),
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra)
    return env


def ctxapp(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxapp.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_refused(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.startswith("ctxapp: ")
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("CTXAPP_PORT", "eighty"),
        ("CTXAPP_PORT", "70000"),
        ("CTXAPP_DEBUG", "maybe"),
        ("CTXAPP_WEB_WORKERS", "0"),
        ("CTXAPP_LOG_LEVEL", "loud"),
        ("CTXAPP_MAX_BODY_BYTES", "-5"),
    ],
)
def test_a_bad_setting_stops_up_naming_the_variable(tmp_path: Path, variable: str, value: str) -> None:
    result = ctxapp(["up"], clean_env(tmp_path, **{variable: value}), tmp_path)
    assert_refused(result, "Configuration error", f"{variable}={value!r}")
    assert not (tmp_path / "data" / "pg").exists()  # nothing was started or created


def test_a_bad_setting_in_the_env_file_is_named_too(tmp_path: Path) -> None:
    (tmp_path / "ctxapp.env").write_text("CTXAPP_PORT=80a\n")
    env = clean_env(tmp_path, CTXAPP_ENV_FILE=str(tmp_path / "ctxapp.env"))
    for args in (["up"], ["config"], ["manage", "check"], ["worker"]):
        assert_refused(ctxapp(args, env, tmp_path), "CTXAPP_PORT='80a'")


def test_django_itself_refuses_a_bad_setting_naming_it(tmp_path: Path) -> None:
    env = clean_env(tmp_path, CTXAPP_DEBUG="perhaps", DJANGO_SETTINGS_MODULE="ctxapp.settings")
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "ImproperlyConfigured: CTXAPP_DEBUG='perhaps' is not a valid bool" in result.stderr


def test_a_half_initialised_data_directory_is_refused(tmp_path: Path) -> None:
    pg = tmp_path / "data" / "pg"
    (pg / "base").mkdir(parents=True)
    (pg / "PG_VERSION").write_text("18\n")  # what an initdb killed half-way leaves
    result = ctxapp(["up"], clean_env(tmp_path, CTXAPP_PORT=str(_free_port())), tmp_path)
    assert_refused(result, "half-initialised", f"rm -rf {pg}")
    assert (pg / "PG_VERSION").exists()  # we never delete what might be someone's data


def test_a_database_directory_that_never_started_is_reported_half_initialised(tmp_path: Path) -> None:
    # Every file initdb writes is there, but the contents are not a database (initdb killed with
    # SIGKILL, a full disk): the server fails to start, and the directory never carried ctxapp's
    # "initialised" marker, so the message is the half-initialised one, with the fix.
    pg = tmp_path / "data" / "pg"
    (pg / "global").mkdir(parents=True)
    (pg / "base").mkdir()
    (pg / "PG_VERSION").write_text("18\n")
    (pg / "global" / "pg_control").write_bytes(b"\0" * 64)
    (pg / "postgresql.conf").write_text("")
    result = ctxapp(["up"], clean_env(tmp_path, CTXAPP_PORT=str(_free_port())), tmp_path)
    assert_refused(result, "half-initialised", f"rm -rf {pg}")
    assert (pg / "PG_VERSION").exists()


def test_an_empty_leftover_database_directory_is_started_over(tmp_path: Path) -> None:
    from ctxapp.infra import embedded

    pg = tmp_path / "data" / "pg"
    pg.mkdir(parents=True)
    (pg / "log").write_text("initdb was killed before it wrote anything\n")
    embedded._check_data_dir(pg)
    assert not pg.exists()  # nothing worth keeping: a fresh start may create it again


def test_a_database_without_pgvector_is_refused(tmp_path: Path) -> None:
    # A real PostgreSQL on which pgvector is not installed: the test server, told to look for
    # extensions in an empty directory (PostgreSQL 18's extension_control_path).
    # The server runs as its own system user, so the directory must be readable by it.
    empty = Path(tempfile.mkdtemp(prefix="ctxapp-no-extensions-"))
    (empty / "extension").mkdir()
    for path in (empty, empty / "extension"):
        path.chmod(0o755)
    db = settings.DATABASES["default"]
    host = db.get("OPTIONS", {}).get("host") or db["HOST"]
    options = quote(f"-c extension_control_path={empty}")
    url = f"postgresql://{db['USER']}@/{db['NAME']}?host={host}&options={options}"
    try:
        result = ctxapp(
            ["up"], clean_env(tmp_path, DATABASE_URL=url, CTXAPP_PORT=str(_free_port())), tmp_path
        )
    finally:
        shutil.rmtree(empty)
    assert_refused(result, "has no pgvector extension", "pgvector/pgvector")


def test_an_unreachable_database_is_refused(tmp_path: Path) -> None:
    url = f"postgresql://ctx:secret@127.0.0.1:{_free_port()}/ctxapp"
    result = ctxapp(["up"], clean_env(tmp_path, DATABASE_URL=url, CTXAPP_PORT=str(_free_port())), tmp_path)
    assert_refused(result, "Cannot connect to DATABASE_URL")


def test_an_unreachable_redis_is_refused_with_its_password_masked(tmp_path: Path) -> None:
    url = f"redis://:hunter2@127.0.0.1:{_free_port()}/0"
    result = ctxapp(["up"], clean_env(tmp_path, REDIS_URL=url, CTXAPP_PORT=str(_free_port())), tmp_path)
    assert_refused(result, "Cannot reach Redis at REDIS_URL=redis://:****@127.0.0.1")
    assert "hunter2" not in result.stderr


def test_help_lists_the_commands(tmp_path: Path) -> None:
    result = ctxapp(["--help"], clean_env(tmp_path), tmp_path)
    assert result.returncode == 0
    for command in ("up", "config", "manage", "web", "worker", "beat"):
        assert command in result.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
