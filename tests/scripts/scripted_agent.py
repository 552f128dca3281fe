"""A scripted agent for the crash-recovery test: a deterministic N-step task through ctxapp.client.

    python tests/scripts/scripted_agent.py --base-url URL --api-key KEY --agent NAME [--steps 50]

Each step "thinks" (a deterministic stand-in for a model call), records an `agent.step` event with
the result, writes its cognitive state, and every `--checkpoint-every` steps takes a checkpoint.
Every write carries an Idempotency-Key derived from the agent and the step, and every body is a
pure function of the step, so redoing a step after a crash writes nothing twice.

On start it always asks for its recovered state: the fold (a declared reducer) says the last step
whose event was recorded; the latest checkpoint's state plus the `agent.step` events after it
rebuild the working memory without re-thinking any recorded step. It then redoes that last step's
remaining writes (all idempotent) and carries on. It prints one line per phase (`<step> <phase>`)
so the test can SIGKILL it at a chosen point, and `done <json>` at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ctxapp.client import Client

GOAL = "sum the step values and keep a running digest"
REDUCERS = [
    {"event_type": "agent.step", "op": "set", "target": "progress.step", "source": "step"},
    {"event_type": "agent.step", "op": "append", "target": "values", "source": "value"},
]


def say(line: str) -> None:
    print(line, flush=True)


def think(step: int) -> int:
    """The stand-in for a model call: deterministic, and never repeated for a recorded step."""
    return int(hashlib.sha256(f"step-{step}".encode()).hexdigest()[:6], 16) % 1000


def apply(memory: dict[str, Any], step: int, value: int) -> dict[str, Any]:
    """The working memory after `step` produced `value`. Pure."""
    digest = hashlib.sha256(f"{memory['digest']}:{step}:{value}".encode()).hexdigest()[:16]
    return {
        "step": step,
        "total": memory["total"] + value,
        "digest": digest,
        "last_values": [*memory["last_values"][-4:], value],
    }


def initial_memory() -> dict[str, Any]:
    return {"step": 0, "total": 0, "digest": "seed", "last_values": []}


def state_of(memory: dict[str, Any], steps: int) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "context": {"goal": GOAL, "constraints": [f"exactly {steps} steps"]},
        "observation": {"last_step": memory["step"]},
        "working_memory": memory,
        "decision": {"next_step": memory["step"] + 1} if memory["step"] < steps else "finished",
        "tool_state": {},
    }


def recover(ctx: Client, agent: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(last recorded step, working memory after it, the recovered-state document)."""
    recovered = ctx.recovered_state(agent, as_agent=agent)
    operational = recovered["operational"] or {}
    last = (operational.get("custom", {}).get("progress") or {}).get("step", 0)
    checkpoint = recovered["checkpoint"]
    memory = checkpoint["state"]["working_memory"] if checkpoint and checkpoint["state"] else initial_memory()
    for event in recovered["events_after_checkpoint"]["items"]:
        payload = event["payload"]
        if event["type"] == "agent.step" and payload["step"] == memory["step"] + 1:
            memory = apply(memory, payload["step"], payload["value"])  # replayed, not re-thought
    if memory["step"] != last:
        raise SystemExit(f"recovered memory at step {memory['step']} but the fold says {last}")
    return last, memory, recovered


def run(ctx: Client, agent: str, steps: int, every: int) -> dict[str, Any]:
    key = lambda *parts: ":".join([agent, *map(str, parts)])  # noqa: E731
    ctx.event_emit(
        agent, "agent.started", {"steps": steps}, idempotency_key=key("started")
    )  # creates the agent
    ctx.reducers_put(agent, REDUCERS, idempotency_key=key("reducers"))
    session = ctx.session_create(agent, user_id="scripted", idempotency_key=key("session"))
    last, memory, recovered = recover(ctx, agent)
    say(f"resumed {last}")
    checkpoint_step = (recovered["checkpoint"] or {}).get("step") or 0
    # redo the last recorded step's remaining writes (idempotent), then go on
    step = max(last, 1)
    if last == 0:
        memory = initial_memory()
    while step <= steps:
        say(f"{step} begin")
        if step > last:
            value = think(step)
            ctx.event_emit(
                agent, "agent.step", {"step": step, "value": value}, idempotency_key=key("step", step)
            )
            memory = apply(memory, step, value)
        say(f"{step} event")
        state = state_of(memory, steps)
        ctx.state_put(agent, state, idempotency_key=key("state", step))
        say(f"{step} state")
        if step % every == 0 and step > checkpoint_step:
            ctx.checkpoint_create(
                agent,
                reason=f"every {every} steps",
                step=step,
                produced_by=f"step:{step}",
                state=state,
                idempotency_key=key("checkpoint", step),
            )
            say(f"{step} checkpoint")
        step += 1
    return {"session": session["id"], "memory": memory}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    args = parser.parse_args()
    with Client(args.base_url, args.api_key, retries=5) as ctx:
        result = run(ctx, args.agent, args.steps, args.checkpoint_every)
    say("done " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
