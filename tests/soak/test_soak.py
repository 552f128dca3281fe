"""The soak drill: `ctxapp up` as the README prints it, under a steady mixed load for
CTXAPP_SOAK_SECONDS (default 180), in both run modes, clean and with an engine taken away for
FAULT_SECONDS in the middle (docs/reliability.md, "Soak drill").

Modes: the embedded engines (the README command: no REDIS_URL, no DATABASE_URL) and "your own"
Redis (REDIS_URL from the `own_redis_url` fixture; the database stays embedded).

Each drill asserts: no request over 5 s, append p99 ≤ 1 s, no 5xx, /readyz "ok" at every poll, no
connection idle in a transaction for more than 5 s, and, once the load stops, every job intent
done (none failed), every appended message embedded, every finished task distilled exactly once.
A fault drill allows, from the fault's start to RECOVERY_GRACE_SECONDS after its end, requests that
fail fast with a JSON 503 and a /readyz that reports the missing part; the rest holds throughout.
Every drill prints its figures on one line (`-s` shows them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.soak.load import (
    SLOW_SECONDS,
    IdleSampler,
    Load,
    exactly_once_failures,
    request_failures,
    settle,
    summary,
)
from tests.soak.stack import (
    READY_SECONDS,
    STOP_SECONDS,
    DatabaseRestart,
    EmbeddedRedisKill,
    Fault,
    Stack,
    ThrowawayRedis,
    redis_database_claim,
    redis_database_release,
)

pytestmark = pytest.mark.soak

SOAK_SECONDS = float(os.environ.get("CTXAPP_SOAK_SECONDS", "180"))
FAULT_SECONDS = 10.0
RECOVERY_GRACE_SECONDS = 30.0  # after the fault: the stack is back by then, by itself
AFTER_RECOVERY_SECONDS = 30.0  # a fault drill's load goes on at least this long after the grace
SETTLE_SECONDS = 240.0  # the background work's catch-up once the load stops
# Redis of the "your own engines" mode: today a database of its own on the machine's Redis.
SHARED_REDIS = "redis://127.0.0.1:6379"


@pytest.fixture
def own_redis_url() -> Iterator[str]:
    """The REDIS_URL of the "your own engines" mode: a database nobody uses on SHARED_REDIS,
    emptied afterwards. Point this at the suite's own Redis server once it has one."""
    url = redis_database_claim(SHARED_REDIS)
    yield url
    redis_database_release(url)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[[str | None], Stack]]:
    """Starts `ctxapp up` in a fresh directory of its own; stops it after the test (Ctrl-C, then
    SIGKILL) and fails if a process outlived it. A watchdog kills it if the drill overruns."""
    stacks: list[Stack] = []

    def start(redis_url: str | None = None) -> Stack:
        stack = Stack(tmp_path / f"newcomer-{len(stacks)}", redis_url)
        stacks.append(stack)
        stack.start()
        return stack

    overall = READY_SECONDS + SOAK_SECONDS + FAULT_SECONDS + 2 * RECOVERY_GRACE_SECONDS + SETTLE_SECONDS + 300
    watchdog = threading.Timer(overall, lambda: [stack.kill() for stack in stacks])
    watchdog.daemon = True
    watchdog.start()
    try:
        yield start
    finally:
        watchdog.cancel()
        left = [process for stack in stacks for process in stack.stop()]
    assert not left, f"processes outlived `ctxapp up` (stopped with Ctrl-C, {STOP_SECONDS:.0f} s): {left}"


def drill(stack: Stack, name: str, fault: Fault | None = None) -> None:
    """The load for SOAK_SECONDS against `stack`, with `fault` from the middle for FAULT_SECONDS
    (then at least RECOVERY_GRACE_SECONDS + AFTER_RECOVERY_SECONDS more), and every check."""
    seconds, fault_at, window = SOAK_SECONDS, max(SOAK_SECONDS / 2 - FAULT_SECONDS / 2, 20.0), None
    if fault is not None:
        seconds = max(seconds, fault_at + FAULT_SECONDS + RECOVERY_GRACE_SECONDS + AFTER_RECOVERY_SECONDS)
    load = Load(stack.base, stack.api_key, stack.password)
    load.prepare()
    load.start(seconds)
    sampler = IdleSampler(stack.pg_uri, load.clock)
    sampler.start()
    try:
        if fault is not None:
            load.wait_for_clock(fault_at)
            began = load.clock()
            try:
                fault.begin()
                load.wait_for_clock(began + FAULT_SECONDS)
            finally:
                fault.end()
            # A request in flight when the fault began may fail too (none may take over 5 s).
            window = (began - SLOW_SECONDS, load.clock() + RECOVERY_GRACE_SECONDS)
            name = f"{name}, {fault.name} at {began:.0f}-{load.clock():.0f} s"
        load.join()
        outcome, settled = settle(stack.pg_uri, load.sessions, SETTLE_SECONDS, stack.running)
    finally:
        load.stop()
        sampler.stop()
    line = summary(name, load, sampler, settled)
    load.write_csv(stack.cwd / "requests.csv")
    print(f"\n{line}\n(every request: {stack.cwd / 'requests.csv'})")
    failures = [
        *stack.stopped_early(),
        *request_failures(load, window),
        *sampler.failures(),
        *exactly_once_failures(load, outcome, settled),
    ]
    assert not failures, "\n".join([line, *failures])


MODES = ["embedded", "own-redis"]


def redis_url_of(mode: str, request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("own_redis_url") if mode == "own-redis" else None


@pytest.mark.parametrize("mode", MODES)
def test_a_steady_mixed_load_holds(
    mode: str, launch: Callable[[str | None], Stack], request: pytest.FixtureRequest
) -> None:
    drill(launch(redis_url_of(mode, request)), f"{mode}, clean")


@pytest.mark.parametrize("mode", MODES)
def test_the_stack_recovers_from_a_database_restart(
    mode: str, launch: Callable[[str | None], Stack], request: pytest.FixtureRequest
) -> None:
    stack = launch(redis_url_of(mode, request))
    drill(stack, mode, DatabaseRestart(stack.pgdata))


def test_the_stack_recovers_from_its_own_redis_killed(launch: Callable[[str | None], Stack]) -> None:
    """Your own Redis: a server of the drill's own (never the machine's shared one), killed and
    started again on its port after FAULT_SECONDS."""
    redis = ThrowawayRedis()
    redis.start()
    try:
        drill(launch(redis.url), "own-redis", redis)
    finally:
        redis.stop()


def test_the_stack_recovers_from_its_embedded_redis_killed(launch: Callable[[str | None], Stack]) -> None:
    """The embedded engines: the Valkey server `ctxapp up` runs, killed (and each replacement too)
    for FAULT_SECONDS; `up` must bring it back by itself."""
    stack = launch(None)
    if stack.up_record("redis") is None:
        pytest.skip(
            'this `ctxapp up` runs no Redis of its own: DATA_DIR/up.json has no "redis" record '
            "(the embedded Valkey of issue 32, item 1, is not in this tree)"
        )
    drill(stack, "embedded", EmbeddedRedisKill(stack))
