"""Crash recovery end to end: a scripted agent process is SIGKILLed mid-task and a new one finishes.

The agent (tests/scripts/scripted_agent.py) drives the real API through ctxapp.client against
pytest-django's live server: a 50-step task, a checkpoint every 10 steps. In each of 20 trials it
is killed with SIGKILL at a random step and phase; a new process fetches its recovered state and
finishes. The final state must equal an uncrashed run's, with every step recorded exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ctxapp.client import Client
from memory.models import Checkpoint, Event
from memory.services import cognition

SCRIPT = Path(__file__).parent / "scripts" / "scripted_agent.py"
STEPS, EVERY, TRIALS = 50, 10, 20

pytestmark = pytest.mark.django_db(transaction=True)


def start(live_server: Any, secret: str, agent: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            "--base-url",
            live_server.url,
            "--api-key",
            secret,
            "--agent",
            agent,
            "--steps",
            str(STEPS),
            "--checkpoint-every",
            str(EVERY),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any], list[str]]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = out.splitlines()
    done = [line for line in lines if line.startswith("done ")]
    assert done, out + err
    resumed = int(next(line for line in lines if line.startswith("resumed ")).split()[1])
    return resumed, json.loads(done[0][5:]), lines


def kill_at(proc: subprocess.Popen[str], marker: str, rng: random.Random) -> list[str]:
    """Read the agent's progress lines; SIGKILL it right after `marker` (plus a random instant)."""
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line.strip())
        if line.strip() == marker:
            time.sleep(rng.uniform(0, 0.01))  # somewhere inside the next request, or between two
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, f"not killed at {marker}: {seen[-3:]}"
    return seen


def final_state(ctx: Client, agent: str) -> dict[str, Any]:
    """Everything a user would compare, without ids and times."""
    state = ctx.state_get(agent)
    checkpoints = ctx.checkpoints_list(agent, limit=100)["items"]
    recovered = ctx.recovered_state(agent, as_agent=agent)
    return {
        "state": {
            k: state[k]
            for k in (
                "schema_version",
                "context",
                "observation",
                "working_memory",
                "decision",
                "tool_state",
                "version",
            )
        },
        "checkpoint_pointer": state["checkpoint"]["seq"],
        "checkpoints": [
            (c["seq"], c["step"], c["reason"], c["produced_by"], c["storage"], c["state_sha256"])
            for c in checkpoints
        ],
        "custom": recovered["operational"]["custom"],
        "latest_checkpoint_state": recovered["checkpoint"]["state"],
    }


def step_events(ctx: Client, agent: str) -> list[int]:
    return [e["payload"]["step"] for e in ctx.events_iter(agent, type="agent.step")]


def trial(live_server: Any, secret: str, number: int, seed: int) -> dict[str, Any]:
    """Run one trial: start, SIGKILL at a random step and phase, restart, finish. Returns what to check."""
    rng = random.Random(seed)
    agent = f"trial-{number}"
    step = rng.randint(1, STEPS)
    phase = rng.choice(["begin", "event", "state"] + (["checkpoint"] if step % EVERY == 0 else []))
    if step == STEPS and phase == "checkpoint":
        phase = "state"  # nothing would be left to crash in
    seen = kill_at(start(live_server, secret, agent), f"{step} {phase}", rng)
    with Client(live_server.url, secret) as ctx:
        recorded = step_events(ctx, agent)
        resumed, result, lines = finish(start(live_server, secret, agent))
        return {
            "trial": number,
            "killed_at": (step, phase),
            "seen": seen[-2:],
            "recorded": recorded,
            "resumed": resumed,
            "lines": lines,
            "result": result,
            "final": final_state(ctx, agent),
            "steps": step_events(ctx, agent),
        }


def test_a_killed_agent_recovers_and_ends_where_an_uncrashed_run_ends_in_20_of_20_trials(
    live_server, tenant_a, make_client
):
    secret = make_client(tenant_a).secret
    resumed, baseline_result, _ = finish(start(live_server, secret, "baseline"))
    assert resumed == 0
    with Client(live_server.url, secret) as ctx:
        baseline = final_state(ctx, "baseline")
        assert step_events(ctx, "baseline") == list(range(1, STEPS + 1))
    assert baseline["state"]["working_memory"]["step"] == STEPS
    assert [c[1] for c in baseline["checkpoints"]] == [50, 40, 30, 20, 10]

    # Trials run a few at a time (each its own agent): the agents are waiting on HTTP, not CPU.
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda n: trial(live_server, secret, n, 20261129 + n), range(TRIALS)))
    for run in runs:
        label = (run["trial"], run["killed_at"], run["seen"])
        recorded = run["recorded"]
        # the new process resumed from what the log held (or from a write still committing then)
        assert run["resumed"] >= (recorded[-1] if recorded else 0), label
        assert run["resumed"] == 0 or recorded, label
        redone = [s for s in range(1, run["resumed"]) if f"{s} begin" in run["lines"]]
        assert redone == [], label  # no step before the recovered one is done again
        assert run["steps"] == list(range(1, STEPS + 1)), label  # every step recorded exactly once
        assert run["result"]["memory"] == baseline_result["memory"], label
        assert run["final"] == baseline, label
    assert sum(run["final"] == baseline for run in runs) == TRIALS
    assert len({run["killed_at"] for run in runs}) > 10  # killed at many different points
    for checkpoint in Checkpoint.objects.filter(tenant=tenant_a):
        cognition.checkpoint_state(checkpoint=checkpoint)  # every stored checkpoint reconstructs and verifies
    assert Event.objects.filter(tenant=tenant_a, type="agent.recovered").count() >= 2 * TRIALS + 1
