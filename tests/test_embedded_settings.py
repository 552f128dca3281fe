"""The embedded PostgreSQL runs with ctxapp's own settings: shared_buffers sized for the machine
(a whole-tenant search walks ~420 MB of heap and HNSW index at 100,000 messages; PostgreSQL's
default is 128 MB), or as CTXAPP_EMBEDDED_SHARED_BUFFERS_MB says.

Each start runs in a child process: a server of its own, stopped when the child exits, never the
test suite's database.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from ctxapp import embedded

REPO = Path(__file__).resolve().parents[1]
START = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import psycopg
    from ctxapp import embedded

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
    monkeypatch.setattr(embedded, "CGROUP_MEMORY_LIMITS", ())  # not this machine's container
    assert embedded.shared_buffers_mb(configured) == expected


def test_a_containers_memory_limit_bounds_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # psutil reports the host's memory; inside a container of 1 GB, a quarter of the host would
    # give PostgreSQL more buffers than the container may hold.
    real = psutil.virtual_memory()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(total=64 * 2**30))
    limit, unlimited = tmp_path / "memory.max", tmp_path / "unlimited"
    limit.write_text(f"{2**30}\n")
    unlimited.write_text("max\n")
    monkeypatch.setattr(embedded, "CGROUP_MEMORY_LIMITS", (unlimited, tmp_path / "absent", limit))
    assert embedded.shared_buffers_mb() == 256
    monkeypatch.setattr(embedded, "CGROUP_MEMORY_LIMITS", (unlimited,))
    assert embedded.shared_buffers_mb() == 2048
