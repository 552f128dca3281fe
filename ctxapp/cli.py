"""The `ctxapp` command.

    ctxapp up        web server (HTTP + websockets), Celery worker and scheduler, and — when
                     DATABASE_URL is unset — the embedded PostgreSQL, together; Ctrl-C stops all
    ctxapp config    every setting's effective value and where it came from (secrets masked)
    ctxapp manage …  Django's management commands (migrate, createsuperuser, create_api_key, …)
    ctxapp web | worker | beat
                     one process each, for production (see docker-compose.yml)
    ctxapp demo      a simulated agent that drives every dashboard panel
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BANNER_WIDTH = 72


class CliError(Exception):
    """A problem the user can fix; printed without a traceback."""


def _settings() -> dict[str, Any]:
    from ctxapp.conf import SettingError, resolve_all

    try:
        return {name: r.value for name, r in resolve_all().items()}
    except SettingError as exc:
        raise CliError(f"Configuration error: {exc}") from None


def _data_dir(values: dict[str, Any]) -> Path:
    return Path(values["CTXAPP_DATA_DIR"]).expanduser().resolve()


def _prepare_database(values: dict[str, Any]) -> None:
    """Start the embedded database, or check the configured one has pgvector."""
    from ctxapp import embedded

    try:
        if values["DATABASE_URL"]:
            embedded.check_pgvector(values["DATABASE_URL"])
        else:
            embedded.ensure_started(_data_dir(values))
    except embedded.EmbeddedDatabaseError as exc:
        raise CliError(str(exc)) from None


def _django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    import django

    django.setup()


# --- config ---------------------------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    from ctxapp.conf import SettingError, markdown_table, resolve_all

    if args.markdown:
        print(markdown_table())
        return 0
    try:
        resolved = resolve_all()
    except SettingError as exc:
        raise CliError(f"Configuration error: {exc}") from None
    width = max(len(name) for name in resolved)
    for name, item in resolved.items():
        print(f"{name:<{width}}  {item.display():<40}  ({item.source})")
    return 0


# --- manage ---------------------------------------------------------------------------------


def cmd_manage(argv: list[str]) -> int:
    values = _settings()
    if argv and argv[0] not in ("help", "--help", "-h"):
        _prepare_database(values)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["ctxapp manage", *argv])
    return 0


# --- up -------------------------------------------------------------------------------------


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise CliError(
                f"Port {port} on {host} is already in use. Stop whatever listens there, "
                f"or choose another port: CTXAPP_PORT={port + 1} ctxapp up"
            ) from None


def _lock_data_dir(data_dir: Path) -> Any:
    """Hold an exclusive lock on the data directory for the life of `ctxapp up`.

    An OS file lock dies with its process, so a crashed run never leaves a stale lock behind;
    the pid file is only there to name the holder in the message.
    """
    import fasteners

    data_dir.mkdir(parents=True, exist_ok=True)
    lock = fasteners.InterProcessLock(str(data_dir / "up.lock"))
    if not lock.acquire(blocking=False):
        holder = (data_dir / "up.pid").read_text().strip() if (data_dir / "up.pid").exists() else "unknown"
        raise CliError(
            f"Another `ctxapp up` (pid {holder}) is already using the data directory {data_dir}. "
            "Stop it first, or give this one its own: CTXAPP_DATA_DIR=/some/other/dir ctxapp up"
        )
    (data_dir / "up.pid").write_text(str(os.getpid()))
    return lock


def _spawn(name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Each child leads its own process group, so Ctrl-C reaches only us and we stop the children
    # (and their own children, such as Celery's pool) in order.
    return subprocess.Popen(argv, env=env, start_new_session=True)


def _stop_children(children: dict[str, subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    for proc in children.values():
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in children.values():
        remaining = max(0.1, deadline - time.monotonic())
        try:
            proc.wait(remaining)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    for proc in children.values():  # anything a child left in its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_ready(url: str, children: dict[str, subprocess.Popen[bytes]], timeout: float = 80.0) -> dict[str, Any]:
    import json

    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for name, proc in children.items():
            if proc.poll() is not None:
                raise CliError(f"The {name} process exited with code {proc.returncode} during start-up.")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return dict(json.loads(response.read()))
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.5)
    raise CliError(f"ctxapp did not become ready within {timeout:.0f} s (last answer: {last}).")


def worker_argv(values: dict[str, Any], *, concurrency: int | None = None) -> list[str]:
    queue = f"{values['CTXAPP_QUEUE_PREFIX']}-default"
    return [
        sys.executable, "-m", "celery", "-A", "ctxapp", "worker",
        "--loglevel", values["CTXAPP_LOG_LEVEL"],
        "--concurrency", str(concurrency or values["CTXAPP_WORKER_CONCURRENCY"]),
        "--queues", queue,
        "--without-gossip", "--without-mingle",
    ]  # fmt: skip


def beat_argv(values: dict[str, Any]) -> list[str]:
    schedule = _data_dir(values) / "celerybeat-schedule"
    return [
        sys.executable, "-m", "celery", "-A", "ctxapp", "beat",
        "--loglevel", values["CTXAPP_LOG_LEVEL"], "--schedule", str(schedule),
    ]  # fmt: skip


def web_argv(values: dict[str, Any], host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "ctxapp.asgi:application",
        "--host", host, "--port", str(port),
        "--workers", str(values["CTXAPP_WEB_WORKERS"]),
        "--log-level", values["CTXAPP_LOG_LEVEL"], "--no-access-log",
        "--lifespan", "off",
    ]  # fmt: skip


def cmd_up(args: argparse.Namespace) -> int:
    values = _settings()
    host = args.host or values["CTXAPP_HOST"]
    port = args.port or values["CTXAPP_PORT"]
    data_dir = _data_dir(values)
    _lock_data_dir(data_dir)
    _check_port_free(host, port)
    print(f"ctxapp: data directory {data_dir}", flush=True)
    if not values["DATABASE_URL"]:
        print("ctxapp: starting the embedded PostgreSQL + pgvector …", flush=True)
    _prepare_database(values)
    _django_setup()
    from django.core.management import call_command

    from memory.services import tenancy

    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    first_run = tenancy.bootstrap_demo()

    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    env["PYTHONUNBUFFERED"] = "1"
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        children["web"] = _spawn("web", web_argv(values, host, port), env)
        children["worker"] = _spawn("worker", worker_argv(values), env)
        children["beat"] = _spawn("beat", beat_argv(values), env)
        base = f"http://{'localhost' if host in {'0.0.0.0', '127.0.0.1', '::'} else host}:{port}"
        report = _wait_ready(f"http://{host if host not in {'0.0.0.0', '::'} else '127.0.0.1'}:{port}/healthz",
                             children)
        del report
        _print_banner(base, first_run)
        while not stopping:
            for name, proc in children.items():
                if proc.poll() is not None:
                    print(f"ctxapp: the {name} process exited (code {proc.returncode}); stopping.", flush=True)
                    stopping = True
                    break
            time.sleep(0.5)
    finally:
        print("ctxapp: stopping …", flush=True)
        _stop_children(children)
        print("ctxapp: stopped.", flush=True)
    return 0


def _print_banner(base: str, first_run: Any) -> None:
    line = "=" * BANNER_WIDTH
    print(line)
    print(f"ctxapp is up at {base}/")
    print(f"  dashboard   {base}/            API docs  {base}/api/docs/")
    print(f"  admin       {base}/admin/      ready     {base}/readyz")
    if first_run is not None:
        print("First run: created tenant 'demo', an admin login and an API key (shown only now):")
        print(f"  admin login   user {first_run.username!r}  password {first_run.password!r}")
        print(f"  API key       {first_run.api_key}")
        print(f"  try it        curl -H 'Authorization: Bearer {first_run.api_key}' {base}/api/v1/tenant")
    else:
        print("Data reused from the previous run; the admin login and key printed then still work.")
        print("  new API key   ctxapp manage create_api_key --tenant demo")
        print("  new password  ctxapp manage changepassword admin")
    print("Ctrl-C stops everything.")
    print(line, flush=True)


# --- single processes (production) ----------------------------------------------------------


def _exec(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    os.execv(argv[0], argv)
    return 0  # not reached


def cmd_web(args: argparse.Namespace) -> int:
    values = _settings()
    _prepare_database(values)
    return _exec(web_argv(values, args.host or values["CTXAPP_HOST"], args.port or values["CTXAPP_PORT"]))


def cmd_worker(args: argparse.Namespace) -> int:
    values = _settings()
    _prepare_database(values)
    return _exec(worker_argv(values))


def cmd_beat(args: argparse.Namespace) -> int:
    values = _settings()
    _prepare_database(values)
    return _exec(beat_argv(values))


def cmd_demo(args: argparse.Namespace) -> int:
    from ctxapp import demo

    return demo.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctxapp", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run everything (web, worker, scheduler, embedded database)")
    up.add_argument("--host")
    up.add_argument("--port", type=int)
    up.set_defaults(func=cmd_up)
    config = sub.add_parser("config", help="print the effective configuration")
    config.add_argument("--markdown", action="store_true", help="print the settings reference as Markdown")
    config.set_defaults(func=cmd_config)
    sub.add_parser("manage", help="Django management commands", add_help=False)
    web = sub.add_parser("web", help="the ASGI web server only")
    web.add_argument("--host")
    web.add_argument("--port", type=int)
    web.set_defaults(func=cmd_web)
    sub.add_parser("worker", help="a Celery worker only").set_defaults(func=cmd_worker)
    sub.add_parser("beat", help="the Celery scheduler only").set_defaults(func=cmd_beat)
    demo = sub.add_parser("demo", help="drive a simulated agent against a running ctxapp")
    demo.add_argument("--url", default="http://127.0.0.1:8000")
    demo.add_argument("--api-key", default=os.environ.get("CTXAPP_API_KEY"))
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["manage"]:
            return cmd_manage(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"ctxapp: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
