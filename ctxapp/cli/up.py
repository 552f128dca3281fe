"""`ctxapp up`: web server (HTTP + websockets), Celery worker and scheduler, and the engines they
need when none is configured — the embedded PostgreSQL (DATABASE_URL unset) and the embedded
Redis engine (REDIS_URL unset) — together; Ctrl-C stops all."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from ctxapp.cli import supervise
from ctxapp.cli.base import (
    CliError,
    Interrupted,
    checked_port,
    command_name,
    data_dir_of,
    django_setup,
    metrics_dir,
    prepare_database,
    settings_load,
)
from ctxapp.cli.processes import beat_argv, web_argv, worker_argv
from ctxapp.conf import CtxappSettings, mask_url
from ctxapp.infra import embedded_redis

BANNER_WIDTH = 72
READY_TIMEOUT_SECONDS = 80.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _check_redis(url: str) -> None:
    # redis-py takes ~0.2 s to import; only `up` with REDIS_URL set needs it.
    import redis  # lazy: startup-cost

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except (redis.RedisError, ValueError) as exc:
        raise CliError(
            f"Cannot reach Redis at REDIS_URL={mask_url(url)} ({exc}). Start Redis, fix REDIS_URL, "
            "or unset it to let `ctxapp up` run its own Redis engine."
        ) from None


def _check_port_free(host: str, port: int) -> None:
    """Bind host:port once, so each reason it cannot be served gets its own message."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise CliError(
            f"Cannot resolve the host {host!r} to bind ({reason}). Give an address of this machine "
            "(127.0.0.1, 0.0.0.0 for every interface, ::1) or a name that resolves to one: "
            "ctxapp up --host 127.0.0.1"
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CliError(
                    f"Port {port} on {host} is already in use ({exc.strerror}). Stop whatever listens "
                    f"there, or choose another port: CTXAPP_PORT={port % 65535 + 1} ctxapp up"
                ) from None
            if exc.errno == errno.EACCES:
                raise CliError(
                    f"Cannot bind port {port} on {host}: permission denied (ports below 1024 need "
                    "privileges). Choose a port above 1024, e.g. --port 8000."
                ) from None
            raise CliError(
                f"Cannot bind {host}:{port} ({exc.strerror}): is {host} an address of this machine? "
                "Use 127.0.0.1, or 0.0.0.0 for every interface."
            ) from None


_interrupted = {"signal": 0, "defer": False}


def _raise_interrupted(signum: int, frame: Any) -> None:
    _interrupted["signal"] = signum
    # While the embedded database initialises, an exception here would kill initdb half-way
    # (subprocess kills its child on any exception) and leave a broken directory: stop after it.
    if not _interrupted["defer"]:
        raise Interrupted()


def _prepare_database_deferring_stop(cfg: CtxappSettings) -> None:
    _interrupted["defer"] = True
    try:
        prepare_database(cfg)
    except CliError:
        if _interrupted["signal"]:  # the error is the interruption's (a terminal's Ctrl-C reaches initdb too)
            raise Interrupted() from None
        raise
    finally:
        _interrupted["defer"] = False
    if _interrupted["signal"]:
        raise Interrupted()


def _migrate_and_bootstrap() -> Any:
    from django.core.management import call_command  # lazy: django-setup
    from django.db import DatabaseError, connections  # lazy: django-setup

    from memory.services import tenancy  # lazy: django-setup

    try:
        call_command("migrate", interactive=False, verbosity=0)
        first_run = tenancy.bootstrap_demo()
    except DatabaseError as exc:
        if _interrupted["signal"]:  # the interruption surfaced as the rollback's error
            raise Interrupted() from None
        raise CliError(f"The database refused the schema setup: {exc}".strip()) from None
    finally:
        connections.close_all()  # the children open their own; we hold none while supervising
    return first_run


def _child_env(data_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir(data_dir))
    # `up` is the one-command developer mode: Celery's "running as root" warning (a container or
    # a CI machine) is noise there; `ctxapp worker` (production) keeps it.
    env["PYTHONWARNINGS"] = "ignore::UserWarning:platformdirs,ignore:You're running the worker with superuser"
    return env


def _prepare(cfg: CtxappSettings, host: str, port: int, data_dir: Path) -> None:
    """Everything before the children start: leftovers, port, Redis, the database."""
    stopped = supervise.stop_leftovers(data_dir)
    if stopped:
        print(
            "ctxapp: stopped processes an earlier `ctxapp up` on this data directory left running: "
            + ", ".join(stopped),
            flush=True,
        )
    (data_dir / "staticfiles").mkdir(exist_ok=True)  # served by ServeStatic (collectstatic target)
    _check_port_free(host, port)
    if cfg.redis_url:
        _check_redis(cfg.redis_url)
    else:
        try:
            embedded_redis.server_binary()
        except embedded_redis.EngineMissing as exc:
            raise CliError(str(exc)) from None
    print(f"ctxapp: data directory {data_dir}", flush=True)
    if cfg.database_url:
        print("ctxapp: checking DATABASE_URL (PostgreSQL with pgvector) …", flush=True)
    else:
        print("ctxapp: starting the embedded PostgreSQL + pgvector …", flush=True)
    _prepare_database_deferring_stop(cfg)
    django_setup()


WEDGE_POLL_SECONDS = 5.0
WEDGED_STOP_SECONDS = 10.0


def _watch(
    children: dict[str, subprocess.Popen[bytes]],
    restarts: supervise.Restarts,
    stop: dict[str, Any],
    data_dir: Path,
) -> int:
    """Until a stop is requested: start a child that died again (with backoff), and restart a
    worker whose heartbeat is overdue (memory/services/job_health.py)."""
    next_poll = time.monotonic() + WEDGE_POLL_SECONDS
    while stop["signal"] is None:
        for name, proc in children.items():
            if proc.poll() is not None:
                restarts.schedule(name, proc.returncode)
        if restarts.restart_due(children):
            supervise.up_file_write(data_dir, children)  # so a later `up` finds the new pids
        if time.monotonic() >= next_poll:
            next_poll = time.monotonic() + WEDGE_POLL_SECONDS
            _restart_if_wedged(children, restarts)
        time.sleep(0.3)
    return 0


def _restart_if_wedged(children: dict[str, subprocess.Popen[bytes]], restarts: supervise.Restarts) -> None:
    worker = children["worker"]
    if worker.poll() is not None or "worker" in restarts.due:
        return
    stalled, age, deadline = _heartbeat()
    started = restarts.started.get("worker", time.monotonic())
    if not stalled or time.monotonic() - started < deadline:
        return
    print(f"ctxapp: the worker runs no jobs (no heartbeat for {age:.0f} s); restarting it.", flush=True)
    supervise.stop_child("worker", worker, WEDGED_STOP_SECONDS)
    restarts.schedule("worker", worker.returncode)


def _heartbeat() -> tuple[bool, float, float]:
    """(stalled, heartbeat age, deadline) from the shared cache, as /readyz's jobs check says it,
    without a request to the web server or a statement to PostgreSQL (an idle `up` polled /readyz
    every 5 s: ~1 statement per second). Redis unreachable: not stalled (nothing to go by)."""
    from memory.services import job_health  # lazy: django-setup

    try:
        stalled, age = job_health.heartbeat_stalled()
    except Exception:
        return False, 0.0, 0.0
    return stalled, age or 0.0, job_health.heartbeat_deadline_seconds()


def cmd_up(args: argparse.Namespace) -> int:
    cfg = settings_load()
    host = args.host or cfg.host
    port = checked_port(args.port or cfg.port)
    data_dir = data_dir_of(cfg)
    # Until the children run, a stop request unwinds normally, so the embedded PostgreSQL we may
    # have started is stopped by its atexit hook (a bare SIGTERM would skip it).
    for signum in STOP_SIGNALS:
        signal.signal(signum, _raise_interrupted)
    # Keep the lock referenced until we return: a collected lock object closes its file and
    # silently releases the lock.
    data_dir_lock = supervise.lock_data_dir(data_dir)
    _prepare(cfg, host, port, data_dir)

    env = _child_env(data_dir)
    children: dict[str, subprocess.Popen[bytes]] = {}
    stop: dict[str, Any] = {"signal": None}

    def request_stop(signum: int, frame: Any) -> None:
        stop["signal"] = signum

    for signum in STOP_SIGNALS:
        signal.signal(signum, request_stop)
    exit_code = 0
    try:
        argvs = {}
        if not cfg.redis_url:
            print("ctxapp: starting the embedded Redis engine …", flush=True)
            argvs["redis"] = embedded_redis.server_argv(data_dir)
            children["redis"] = supervise.spawn(argvs["redis"], env, "redis")
            _wait_for_redis(data_dir, children["redis"])
        # With Redis up: a migration tells every process's configuration cache (through Redis).
        print("ctxapp: applying database migrations …", flush=True)
        first_run = _migrate_and_bootstrap()
        if stop["signal"] is not None:
            raise Interrupted()
        print("ctxapp: starting the web server, the Celery worker and the scheduler …", flush=True)
        argvs.update(web=web_argv(cfg, host, port), worker=worker_argv(cfg), beat=beat_argv(cfg))
        restarts = supervise.Restarts(argvs=argvs, env=env)
        for name, argv in argvs.items():
            if name not in children:
                children[name] = supervise.spawn(argv, env, name)
            restarts.note_started(name)
        supervise.up_file_write(data_dir, children)
        local = supervise.local_url(host, port)
        report = supervise.wait_ready(
            f"{local}/readyz", children, lambda: stop["signal"] is not None, READY_TIMEOUT_SECONDS
        )
        _print_banner(local, report, first_run, data_dir, dataclasses.replace(cfg, host=host))
        supervise.server_file_write(data_dir, local)
        exit_code = _watch(children, restarts, stop, data_dir)
    except Interrupted:
        pass
    finally:
        _shut_down(children, cfg, data_dir)
        data_dir_lock.release()
    return exit_code


def _wait_for_redis(data_dir: Path, proc: subprocess.Popen[bytes]) -> None:
    url = embedded_redis.url(data_dir)
    if not embedded_redis.wait_until_answers(url, alive=lambda: proc.poll() is None):
        log = embedded_redis.redis_dir(data_dir) / "redis.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else "(no log)"
        raise CliError(
            f"The embedded Redis engine did not start (exit code {proc.poll()}). Its log ends with:\n{tail}"
        )


def _shut_down(children: dict[str, subprocess.Popen[bytes]], cfg: CtxappSettings, data_dir: Path) -> None:
    if children:
        print("\nctxapp: stopping …", flush=True)
        # The engines last: the web server and the worker finish what they were doing on them.
        supervise.stop_children({name: proc for name, proc in children.items() if name != "redis"})
        if "redis" in children:
            supervise.stop_children({"redis": children["redis"]})
    if not cfg.database_url:
        print("ctxapp: stopping the embedded PostgreSQL …", flush=True)
        supervise.stop_embedded()
    print("ctxapp: stopped.", flush=True)
    supervise.server_file_remove(data_dir)
    with contextlib.suppress(OSError):
        (data_dir / supervise.UP_FILE).unlink()


def _print_banner(
    base: str, report: dict[str, Any], first_run: Any, data_dir: Path, cfg: CtxappSettings
) -> None:
    checks = report.get("checks", {})
    parts = []
    for name, check in checks.items():
        detail = (
            check.get("transport")
            or check.get("backend")
            or (f"pgvector {check['pgvector']}" if check.get("pgvector") else "")
        )
        detail = f" ({detail})" if detail else ""
        parts.append(f"{name.replace('_', ' ')} ok{detail}" if check.get("ok") else f"{name} FAILING")
    same_dir = "" if data_dir == data_dir_of(CtxappSettings()) else f"CTXAPP_DATA_DIR={data_dir} "
    ctxapp = command_name()
    line = "=" * BANNER_WIDTH
    print(line)
    print(f"ctxapp is up at {base}/")
    print(f"  {', '.join(parts)}")
    print(f"  dashboard   {base}/            API docs  {base}/api/docs/")
    print(f"  admin       {base}/admin/      ready     {base}/readyz")
    if cfg.host in {"0.0.0.0", "::"}:
        hosts = ",".join(cfg.allowed_hosts)
        print(f"  from other machines: add the name they use to CTXAPP_ALLOWED_HOSTS (now {hosts})")
    if first_run is not None:
        print("First run: created tenant 'demo', an admin login and an API key (shown only now):")
        print(f"  admin login   user {first_run.username}  password {first_run.password}")
        print(f"  API key       {first_run.api_key}")
        print(f"  try it        curl -H 'Authorization: Bearer {first_run.api_key}' {base}/api/v1/tenant")
        print(f"  see it move   {same_dir}{ctxapp} demo --api-key {first_run.api_key}")
    else:
        print("Data reused from the previous run; the admin login and API key printed then still work.")
        print(f"  new API key   {same_dir}{ctxapp} manage create_api_key --tenant demo")
        print(f"  new password  {same_dir}{ctxapp} manage changepassword admin")
    print("Ctrl-C stops everything.")
    print(line, flush=True)
