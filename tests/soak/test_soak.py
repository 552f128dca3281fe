"""The soak drill: `ctxapp up` as the README prints it, under a steady mixed load for
CTXAPP_SOAK_SECONDS (default 180), in both run modes; and the same load for
CTXAPP_SOAK_FAULT_SECONDS (default 90) with an engine taken away for FAULT_SECONDS in the middle
(docs/reliability.md, "Soak drill"). The drills of one mode share one `ctxapp up`, in order: each
fault drill restores what it took away, and the next drill finds the stack as a user would.

Modes: the embedded engines (the README command: no REDIS_URL, no DATABASE_URL) and "your own"
Redis (REDIS_URL set to a Valkey server of the drill's own; the database stays embedded).

Each drill asserts: no request over 5 s, no 5xx, /readyz "ok" at every poll, no
connection idle in a transaction for more than 5 s, and, once the load stops, every job intent
done (none failed), every appended message embedded, every finished task distilled exactly once.
A fault drill allows, from the fault's start to RECOVERY_GRACE_SECONDS after its end, requests that
fail fast with a JSON 503 and a /readyz that reports the missing part; the rest holds throughout.
Every drill prints its figures on one line (`-s` shows them).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
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
)

pytestmark = pytest.mark.soak

SOAK_SECONDS = float(os.environ.get("CTXAPP_SOAK_SECONDS", "180"))
# A fault drill: the load with the fault in its middle, long enough for the fault, the recovery
# grace and AFTER_RECOVERY_SECONDS of load on the recovered stack.
FAULT_DRILL_SECONDS = float(os.environ.get("CTXAPP_SOAK_FAULT_SECONDS", "90"))
FAULT_SECONDS = 10.0
RECOVERY_GRACE_SECONDS = 30.0  # after the fault: the stack is back by then, by itself
AFTER_RECOVERY_SECONDS = 25.0  # a fault drill's load goes on at least this long after the grace
SETTLE_SECONDS = 240.0  # the background work's catch-up once the load stops


@contextlib.contextmanager
def launched(cwd: Path, redis_url: str | None = None) -> Iterator[Stack]:
    """`ctxapp up` in a fresh directory of its own, shared by the drills of one mode (each drill
    restores what it takes away); stopped afterwards (Ctrl-C, then SIGKILL), failing if a process
    outlived it. A watchdog kills it if the drills overrun."""
    stack = Stack(cwd, redis_url)
    overall = READY_SECONDS + 3 * (SOAK_SECONDS + FAULT_DRILL_SECONDS + SETTLE_SECONDS) + 300
    watchdog = threading.Timer(overall, stack.kill)
    watchdog.daemon = True
    watchdog.start()
    try:
        stack.start()
        yield stack
    finally:
        watchdog.cancel()
        left = stack.stop()
    assert not left, f"processes outlived `ctxapp up` (stopped with Ctrl-C, {STOP_SECONDS:.0f} s): {left}"


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The README command: the embedded PostgreSQL and Redis engines."""
    with launched(tmp_path_factory.mktemp("soak-embedded")) as stack:
        yield stack


@pytest.fixture(scope="module")
def own_redis() -> Iterator[ThrowawayRedis]:
    """A Redis server of "your own" (REDIS_URL): a Valkey of the drill's own, never a shared one."""
    redis = ThrowawayRedis()
    redis.start()
    yield redis
    redis.stop()


@pytest.fixture(scope="module")
def own(own_redis: ThrowawayRedis, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`ctxapp up` with REDIS_URL set to a server of your own (the database stays embedded)."""
    with launched(tmp_path_factory.mktemp("soak-own"), own_redis.url) as stack:
        yield stack


def drill(stack: Stack, name: str, fault: Fault | None = None) -> None:
    """The load against `stack`, for SOAK_SECONDS, or with `fault` from the middle for
    FAULT_SECONDS within FAULT_DRILL_SECONDS (at least the fault, the recovery grace and
    AFTER_RECOVERY_SECONDS), and every check."""
    seconds, fault_at, window = SOAK_SECONDS, 20.0, None
    if fault is not None:
        seconds = max(
            FAULT_DRILL_SECONDS, fault_at + FAULT_SECONDS + RECOVERY_GRACE_SECONDS + AFTER_RECOVERY_SECONDS
        )
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
    csv = stack.cwd / f"requests-{name.split(',')[0].replace(' ', '-')}-{int(time.time())}.csv"
    load.write_csv(csv)
    print(f"\n{line}\n(every request: {csv})")
    failures = [
        *stack.stopped_early(),
        *request_failures(load, window),
        *sampler.failures(),
        *exactly_once_failures(load, outcome, settled),
    ]
    assert not failures, "\n".join([line, *failures])


# The drills of one mode run in order on one stack, on one test worker.
@pytest.mark.xdist_group("soak-embedded")
def test_the_readme_command_holds_a_steady_mixed_load(embedded: Stack) -> None:
    drill(embedded, "embedded, clean")


@pytest.mark.xdist_group("soak-embedded")
def test_the_readme_command_recovers_from_a_database_restart(embedded: Stack) -> None:
    drill(embedded, "embedded", DatabaseRestart(embedded.pgdata))


@pytest.mark.xdist_group("soak-embedded")
def test_the_readme_command_recovers_from_its_redis_killed(embedded: Stack) -> None:
    """The Valkey server `ctxapp up` runs, killed (and each replacement too) for FAULT_SECONDS:
    `up` brings it back by itself."""
    assert embedded.up_record("redis") is not None, 'up.json has no "redis" record: no embedded Redis engine'
    drill(embedded, "embedded", EmbeddedRedisKill(embedded))


@pytest.mark.xdist_group("soak-own")
def test_your_own_redis_holds_a_steady_mixed_load(own: Stack) -> None:
    drill(own, "own-redis, clean")


@pytest.mark.xdist_group("soak-own")
def test_your_own_redis_killed_is_recovered_from(own: Stack, own_redis: ThrowawayRedis) -> None:
    """Your own Redis, killed and started again on its port after FAULT_SECONDS, without
    persistence: every queued job is lost, and the outbox sends them again."""
    drill(own, "own-redis", own_redis)
