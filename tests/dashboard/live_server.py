"""A real ASGI server (uvicorn, HTTP + websockets) on the test database, for browser tests
and the screenshot script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

CHROMIUM = os.environ.get("CTXAPP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def uvicorn_server(
    env: dict[str, str], *, timeout: float = 60.0, argv: Callable[[int], list[str]] | None = None
) -> Iterator[str]:
    """Run `ctxapp.asgi` under uvicorn on a free port; yield its base URL; stop it afterwards.
    `argv(port)` replaces the command line (e.g. the one `ctxapp web` runs)."""
    port = free_port()
    proc = subprocess.Popen(
        argv(port)
        if argv
        else [
            sys.executable,
            "-m",
            "uvicorn",
            "ctxapp.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"uvicorn exited with code {proc.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                    break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
