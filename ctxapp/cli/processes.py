"""The three long-running processes: how each is started (`ctxapp up` spawns them all), and
`ctxapp web | worker | beat`, one process each for production (see docker-compose.yml)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ctxapp.cli.base import checked_port, data_dir_of, metrics_dir, prepare_database, settings_values


def worker_argv(values: dict[str, Any], *, concurrency: int | None = None) -> list[str]:
    queue = f"{values['CTXAPP_QUEUE_PREFIX']}-default"
    return [
        sys.executable, "-m", "celery", "-A", "ctxapp", "--quiet", "worker",
        "--loglevel", values["CTXAPP_LOG_LEVEL"],
        "--concurrency", str(concurrency or values["CTXAPP_WORKER_CONCURRENCY"]),
        "--queues", queue,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def beat_argv(values: dict[str, Any]) -> list[str]:
    schedule = data_dir_of(values) / "celerybeat-schedule"
    return [
        sys.executable, "-m", "celery", "-A", "ctxapp", "--quiet", "beat",
        "--loglevel", values["CTXAPP_LOG_LEVEL"], "--schedule", str(schedule),
    ]  # fmt: skip


def web_argv(values: dict[str, Any], host: str, port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "ctxapp.asgi:application",
        "--host", host, "--port", str(port),
        "--workers", str(values["CTXAPP_WEB_WORKERS"]),
        "--log-level", "warning" if values["CTXAPP_LOG_LEVEL"] == "info" else values["CTXAPP_LOG_LEVEL"],
        "--no-access-log", "--lifespan", "off", "--timeout-graceful-shutdown", "5",
    ]  # fmt: skip


def _exec(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    os.execv(argv[0], argv)
    return 0  # not reached


def cmd_web(args: argparse.Namespace) -> int:
    values = settings_values()
    port = checked_port(args.port or values["CTXAPP_PORT"])
    prepare_database(values)
    if values["CTXAPP_WEB_WORKERS"] > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir(data_dir_of(values)))
    return _exec(web_argv(values, args.host or values["CTXAPP_HOST"], port))


def cmd_worker(args: argparse.Namespace) -> int:
    values = settings_values()
    prepare_database(values)
    return _exec(worker_argv(values))


def cmd_beat(args: argparse.Namespace) -> int:
    values = settings_values()
    prepare_database(values)
    return _exec(beat_argv(values))
