"""The three long-running processes: how each is started (`ctxapp up` spawns them all), and
`ctxapp web | worker | beat`, one process each for production (see docker-compose.yml)."""

from __future__ import annotations

import argparse
import os
import sys

from ctxapp.cli.base import (
    checked_port,
    data_dir_of,
    metrics_dir,
    prepare_database,
    require_redis,
    settings_load,
)
from ctxapp.conf import CtxappSettings


def worker_argv(cfg: CtxappSettings, *, concurrency: int | None = None, name: str | None = None) -> list[str]:
    queue = f"{cfg.queue_prefix}-default"
    # Two workers on one host with one node name would answer control commands (ping, inspect)
    # as one: each needs its own.
    named = ["--hostname", name] if name else []
    return [
        sys.executable, "-m", "celery", "-A", "ctxapp", "--quiet", "worker",
        "--loglevel", cfg.log_level,
        "--pool", cfg.worker_pool,
        "--concurrency", str(concurrency or cfg.worker_concurrency),
        "--queues", queue,
        "--without-gossip", "--without-mingle", "--without-heartbeat", *named,
    ]  # fmt: skip


def beat_argv(cfg: CtxappSettings) -> list[str]:
    schedule = data_dir_of(cfg) / "celerybeat-schedule"
    return [
        sys.executable, "-m", "celery", "-A", "ctxapp", "--quiet", "beat",
        "--loglevel", cfg.log_level, "--schedule", str(schedule),
    ]  # fmt: skip


# How long the web server keeps an idle keep-alive connection (see web_argv).
KEEP_ALIVE_SECONDS = 75


def web_argv(cfg: CtxappSettings, host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "ctxapp.asgi:application",
        "--host", host, "--port", str(port),
        "--workers", str(cfg.web_workers),
        "--log-level", "warning" if cfg.log_level == "info" else cfg.log_level,
        "--no-access-log", "--lifespan", "off", "--timeout-graceful-shutdown", "5",
        # h11, uvicorn's pure-Python parser, hands a method it does not know (`FOO`) to the app,
        # which answers it in the JSON error shape; httptools refuses it itself in plain text.
        # Measured: +0.1-0.2 ms of CPU on a 2.2 ms GET /healthz.
        "--http", "h11",
        # An idle keep-alive connection stays open longer than clients and proxies keep one
        # (httpx 5 s, nginx and cloud load balancers 60 s): a server that closes it first can do
        # so just as a client sends on it, and the client reads a reset for a request the server
        # never saw (uvicorn's default is 5 s; the soak drill saw one append reset so).
        "--timeout-keep-alive", str(KEEP_ALIVE_SECONDS),
        # uvicorn would otherwise take X-Forwarded-For from loopback as the client address, so a
        # client could pick its own; memory.api.throttles.client_address alone reads that header,
        # honouring CTXAPP_NUM_PROXIES.
        "--no-proxy-headers",
    ]  # fmt: skip


def _exec(argv: list[str], name: str) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    # libpq's application_name: pg_stat_activity and the server's log tell the processes apart.
    os.environ.setdefault("PGAPPNAME", f"ctxapp-{name}")
    os.execv(argv[0], argv)
    return 0  # not reached


def cmd_web(args: argparse.Namespace) -> int:
    cfg = settings_load()
    port = checked_port(args.port or cfg.port)
    prepare_database(cfg)
    require_redis(cfg)
    if cfg.web_workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir(data_dir_of(cfg)))
    return _exec(web_argv(cfg, args.host or cfg.host, port), "web")


def cmd_worker(args: argparse.Namespace) -> int:
    cfg = settings_load()
    prepare_database(cfg)
    require_redis(cfg)
    return _exec(worker_argv(cfg, name=args.name), "worker")


def cmd_beat(args: argparse.Namespace) -> int:
    cfg = settings_load()
    prepare_database(cfg)
    require_redis(cfg)
    return _exec(beat_argv(cfg), "beat")
