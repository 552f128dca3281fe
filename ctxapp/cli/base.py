"""What every `ctxapp` command shares: user-fixable errors, the settings, the data directory,
the database and Django start-up, and how to type `ctxapp` here."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

import django
from django.core.exceptions import ImproperlyConfigured

from ctxapp.conf import CtxappSettings, SettingError, _file_values, load

EXIT_USAGE = 2  # a problem the user can fix (bad setting, port in use, …)
EXIT_INTERRUPTED = 130
DATA_DIR_NAME = ".ctxapp"


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


class Interrupted(Exception):
    """SIGINT/SIGTERM/SIGHUP arrived while `ctxapp up` was starting."""


def settings_load() -> CtxappSettings:
    """The effective settings, typed; a value that does not parse is a CliError."""
    try:
        return load()
    except SettingError as exc:
        raise CliError(f"Configuration error: {exc}") from None


def data_dir_of(cfg: CtxappSettings) -> Path:
    return Path(cfg.data_dir).expanduser().resolve()


def anchor_data_dir(cwd: Path | None = None) -> Path | None:
    """Pin CTXAPP_DATA_DIR for this command and its children, the same from any directory.

    Set explicitly (environment or env file): that. Otherwise the nearest `.ctxapp` in the
    current directory or one of its parents, the way git finds `.git`, so `ctxapp manage …` run
    from a subdirectory of the project reaches the project's database instead of creating an
    empty one; with none, `./.ctxapp` (a first `ctxapp up` creates it). Returns what it pinned.
    """
    if "CTXAPP_DATA_DIR" in os.environ or "CTXAPP_DATA_DIR" in _file_values():
        return None
    start = (cwd or Path.cwd()).resolve()
    for directory in (start, *start.parents):
        if (directory / DATA_DIR_NAME).is_dir():
            os.environ["CTXAPP_DATA_DIR"] = str(directory / DATA_DIR_NAME)
            return directory / DATA_DIR_NAME
    return None


def prepare_database(cfg: CtxappSettings) -> None:
    """Start the embedded database, or check the configured one has pgvector."""
    # psycopg takes ~0.1 s to import; the commands that only call a server never need it.
    from ctxapp.infra import embedded  # lazy: startup-cost

    try:
        if cfg.database_url:
            embedded.check_pgvector(cfg.database_url)
        else:
            embedded.ensure_started(data_dir_of(cfg), shared_buffers=cfg.embedded_shared_buffers_mb)
    except embedded.EmbeddedDatabaseError as exc:
        raise CliError(str(exc)) from None


def require_redis(cfg: CtxappSettings) -> None:
    """A process run on its own (`ctxapp web | worker | beat`) needs a Redis server: REDIS_URL's,
    or the embedded engine a `ctxapp up` runs on the same data directory."""
    if cfg.redis_url:
        return
    from ctxapp.infra import embedded_redis  # lazy: startup-cost

    if not embedded_redis.ping(embedded_redis.url(data_dir_of(cfg))):
        raise CliError(
            "REDIS_URL is unset and no `ctxapp up` runs a Redis engine for the data directory "
            f"{data_dir_of(cfg)}. Set REDIS_URL to your Redis server (production, docs/production.md), "
            "or run everything together with `ctxapp up`."
        )


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    try:
        django.setup()
    except ImproperlyConfigured as exc:
        raise CliError(f"Configuration error: {exc}") from None
    # The Celery app jobs are sent through (the commands that only call a server never load it).
    import ctxapp.celery  # noqa: F401  # lazy: startup-cost


def checked_port(port: int) -> int:
    if not 0 < port < 65536:
        raise CliError(f"--port {port} is not a TCP port: choose one from 1 to 65535, e.g. --port 8000.")
    return port


def metrics_dir(data_dir: Path) -> Path:
    """A fresh directory for the web processes' Prometheus samples (multiprocess mode)."""
    path = data_dir / "prometheus"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def command_name() -> str:
    """How to type `ctxapp` here: the bare name when the shell finds this very script on the PATH,
    else the script next to this interpreter (`.venv/bin/ctxapp` after the README's install)."""
    script = Path(sys.executable).parent / "ctxapp"
    on_path = shutil.which("ctxapp")
    if on_path and script.exists() and Path(on_path).resolve() == script.resolve():
        return "ctxapp"
    if not script.exists():
        return f"{sys.executable} -m ctxapp.cli"
    with contextlib.suppress(ValueError):
        relative = script.relative_to(Path.cwd())
        return str(relative) if str(relative).startswith(".") else f"./{relative}"
    return str(script)
