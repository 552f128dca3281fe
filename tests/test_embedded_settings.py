"""The embedded PostgreSQL runs with ctxapp's own settings: shared_buffers sized for the machine
(a whole-tenant search walks ~420 MB of heap and HNSW index at 100,000 messages; PostgreSQL's
default is 128 MB), or as CTXAPP_EMBEDDED_SHARED_BUFFERS_MB says.

Each start runs in a child process: a server of its own, stopped when the child exits, never the
test suite's database.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from ctxapp.infra import embedded

REPO = Path(__file__).resolve().parents[1]
START = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import psycopg
    from ctxapp.infra import embedded

    server = embedded.start_server(Path(sys.argv[1]), shared_buffers=int(sys.argv[2]))
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        print(conn.execute("SHOW shared_buffers").fetchone()[0])
    """
)


def start_and_show(pgdata: Path, shared_buffers: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", START, str(pgdata), str(shared_buffers)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.cli_up
def test_the_embedded_server_starts_with_ctxapps_shared_buffers(tmp_path: Path) -> None:
    pgdata = tmp_path / "pg"
    assert start_and_show(pgdata, 160) == "160MB"  # first start: initdb, then ctxapp's settings
    # The next start applies the setting of that start, and postgresql.conf includes it once.
    expected = embedded.shared_buffers_mb()
    assert start_and_show(pgdata, 0) == (f"{expected // 1024}GB" if expected % 1024 == 0 else f"{expected}MB")
    conf = (pgdata / "postgresql.conf").read_text()
    assert conf.count(f"include_if_exists = '{embedded.SETTINGS_FILE}'") == 1
    assert not (pgdata / "postmaster.pid").exists()  # each child stopped its server


@pytest.mark.parametrize(
    ("memory_mb", "configured", "expected"),
    [
        (24 * 1024, 0, 2048),  # a quarter of 24 GB, capped
        (2 * 1024, 0, 512),  # a quarter of a small machine's memory
        (256, 0, 128),  # never below PostgreSQL's own default
        (24 * 1024, 300, 300),  # CTXAPP_EMBEDDED_SHARED_BUFFERS_MB wins
    ],
)
def test_shared_buffers_default_to_a_quarter_of_memory_within_bounds(
    monkeypatch: pytest.MonkeyPatch, memory_mb: int, configured: int, expected: int
) -> None:
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(total=memory_mb * 2**20))
    monkeypatch.setattr(embedded, "CGROUP_MEMBERSHIP", Path("/nonexistent/cgroup"))  # no container
    assert embedded.shared_buffers_mb(configured) == expected


def test_a_containers_memory_limit_bounds_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # psutil reports the host's memory; inside a container or a systemd unit of 1 GB, a quarter
    # of the host would give PostgreSQL more buffers than it may hold.
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(total=64 * 2**30))
    root, membership = tmp_path / "cgroup", tmp_path / "self-cgroup"
    unit = root / "system.slice" / "ctxapp.service"
    unit.mkdir(parents=True)
    (root / "memory.max").write_text("max\n")  # the root: no limit
    (unit / "memory.max").write_text(f"{2**30}\n")
    membership.write_text("0::/system.slice/ctxapp.service\n")
    monkeypatch.setattr(embedded, "CGROUP_ROOT", root)
    monkeypatch.setattr(embedded, "CGROUP_MEMBERSHIP", membership)
    assert embedded.shared_buffers_mb() == 256
    (unit / "memory.max").write_text("max\n")
    assert embedded.shared_buffers_mb() == 2048


def test_cgroup_limits_are_read_for_the_process_and_its_ancestors() -> None:
    root = Path("/sys/fs/cgroup")
    v2 = embedded.cgroup_memory_limit_files("0::/a/b\n", root)
    assert v2 == [root / "a/b/memory.max", root / "a/memory.max", root / "memory.max"]
    v1 = embedded.cgroup_memory_limit_files("5:cpu,cpuacct:/x\n4:memory:/docker/abc\n", root)
    assert v1 == [
        root / "memory/docker/abc/memory.limit_in_bytes",
        root / "memory/docker/memory.limit_in_bytes",
        root / "memory/memory.limit_in_bytes",
    ]
    assert embedded.cgroup_memory_limit_files("garbage\n", root) == []


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_settings_file_that_cannot_be_written_does_not_stop_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the module's own logger: another test's logging configuration may have disabled it or
    # stopped its propagation to the root logger that caplog listens on.
    records = _Records()
    monkeypatch.setattr(embedded.logger, "disabled", False)
    monkeypatch.setattr(embedded.logger, "level", logging.WARNING)
    monkeypatch.setattr(embedded.logger, "handlers", [records])
    pgdata = tmp_path / "pg"
    pgdata.mkdir()
    (pgdata / "postgresql.conf").write_text("shared_buffers = 128MB\n")
    (pgdata / embedded.SETTINGS_FILE).mkdir()  # a directory where the file should be
    embedded.write_server_settings(pgdata, shared_buffers=300)
    assert any("could not write the embedded PostgreSQL's settings" in m for m in records.messages)
    conf = (pgdata / "postgresql.conf").read_text()
    assert conf.startswith("shared_buffers = 128MB\n")  # initdb's settings kept, the include added
    assert conf.count(f"include_if_exists = '{embedded.SETTINGS_FILE}'") == 1
    assert [p.name for p in pgdata.iterdir() if p.name.endswith(".tmp")] == []  # nothing left behind
