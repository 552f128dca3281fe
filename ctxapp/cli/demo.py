"""`ctxapp demo`: a simulated on-call agent that makes every dashboard panel move.

It drives a running ctxapp through the Python client (ctxapp/client/), like a real agent:

1. incident 1 — agent `ops-copilot` investigates checkout 502s with the on-call engineer:
   a session, nine tracked facts (constraints, goals, preferences, critical info, …), a task,
   22 turns of user / assistant / tool messages, a context build every turn on a deliberately
   small window (2,000 tokens) so the budget climbs past the 85 % line and summarisation runs,
   facts referenced now and then (the rest decay), cognitive state and checkpoints at each
   milestone;
2. the task finishes → distillation into experiences → embedding jobs; a few experiences
   recorded directly, and a hybrid search;
3. a crash (`agent.crashed`), then recovery: the agent fetches its recovered state and resumes
   in a new session from the latest checkpoint;
4. incident 2 — a second agent `db-doctor` searches past experiences and works a short session.

Every step tolerates a capability that is not there (404 for the endpoint, or an error): it
prints a note and goes on, so the demo works at any stage of the product.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxapp.cli.base import command_name
from ctxapp.client import Client, CtxappError, NetworkError, NotFound, Unauthorized

DEMO_WINDOW = {"max_input_tokens": 2000, "output_reserve": 256, "history_window": 60, "keep_verbatim": 4}
DEFAULT_PACE = 0.3  # seconds between turns, so a watcher sees panels move
AGENT = "ops-copilot"
SYSTEM_PARTS = [{"name": "core", "content": "You are ops-copilot, an SRE assistant.", "critical": True}]

# The story as data: the turns, facts, milestones and experiences (demo_script.json).
SCRIPT: dict[str, Any] = json.loads((Path(__file__).parent / "demo_script.json").read_text())
Turn = tuple[str, str, dict[str, Any] | None, str]  # user, assistant, tool call or None, tool result
INCIDENT_TURNS: list[Turn] = [(user, said, tool, out) for user, said, tool, out in SCRIPT["incident_turns"]]
RESUME_TURNS: list[tuple[str, str]] = [(user, said) for user, said in SCRIPT["resume_turns"]]
DB_DOCTOR_TURNS: list[tuple[str, str]] = [(user, said) for user, said in SCRIPT["db_doctor_turns"]]
EXTRA_EXPERIENCES: list[dict[str, Any]] = SCRIPT["extra_experiences"]


def incident_state(
    observation: str, *, decision: str | None, working_memory: dict[str, Any], tool_state: dict[str, Any]
) -> dict[str, Any]:
    """The ops-copilot's cognitive state at one point of incident 1."""
    return {
        "context": SCRIPT["incident_context"],
        "observation": observation,
        "working_memory": working_memory,
        "decision": decision,
        "tool_state": tool_state,
    }


class Demo:
    def __init__(self, client: Any, *, pace: float, out: Callable[[str], None] = print) -> None:
        self.ctx = client
        self.pace = pace
        self.out = out
        self.skipped: list[str] = []
        self.done: list[str] = []
        self.run_id = uuid.uuid4().hex[:6]
        self._fact_ids: dict[tuple[str, str], str] = {}

    # --- plumbing -------------------------------------------------------------------------------
    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Run one step; a missing capability or a failure is reported and skipped, never fatal."""
        try:
            yield
        except Unauthorized:
            raise
        except NotFound as exc:
            self.skipped.append(name)
            self.out(f"  - skipped {name}: not available on this server yet ({exc.message})")
        except CtxappError as exc:
            self.skipped.append(name)
            self.out(f"  - skipped {name}: {exc.code} ({exc.message})")
        else:
            self.done.append(name)

    def wait(self, factor: float = 1.0) -> None:
        if self.pace > 0:
            time.sleep(self.pace * factor)

    def checkpoint(self, agent: str, reason: str, **fields: Any) -> None:
        with self.step("checkpoint"):
            self.ctx.checkpoint_create(agent, reason=reason, **fields)

    def context_build(self, sid: str, body: dict[str, Any]) -> None:
        with self.step("context build"):
            self.ctx.request("POST", f"/sessions/{sid}/context", json=body)

    def conversation(self, sid: str, turns: list[tuple[str, str]], body: dict[str, Any]) -> None:
        """Turns without tools, each followed by a context build."""
        for turn, (user, assistant) in enumerate(turns, start=1):
            self.turn(sid, turn, user, assistant, None, "")
            self.context_build(sid, body)
            self.wait()

    # --- the story ------------------------------------------------------------------------------
    def run(self) -> int:
        tenant = self.ctx.request("GET", "/tenant")
        self.out(f"ctxapp demo: tenant {tenant['name']!r} (key {tenant['key_prefix']}…), run {self.run_id}")
        self.out(f"Incident 1: checkout 502s (agent {AGENT})")
        sid = self.incident()
        self.out("Crash and recovery")
        self.crash_and_resume(sid)
        self.out("Incident 2: orders API timeouts (agent db-doctor)")
        self.second_incident()
        self.out(
            f"Done: {len(self.done)} steps ran, {len(self.skipped)} skipped"
            + (f" ({', '.join(sorted(set(self.skipped)))})" if self.skipped else "")
            + "."
        )
        return 0

    def incident(self) -> str:
        """Incident 1: a session with facts, a task, the turns with a context build each and
        checkpoints at the milestones; then the task's completion, distillation and experiences."""
        ctx = self.ctx
        session = ctx.session_create(
            AGENT,
            user_id="oncall-ana",
            model="gpt-4o-mini",
            metadata={"incident": f"INC-{self.run_id}", "demo": True},
        )
        sid = str(session["id"])
        self.out(f"  session {sid}")
        with self.step("cognitive state"):
            start = incident_state(
                "502s on checkout since 09:14",
                decision=None,
                working_memory={"suspects": ["lb", "web-3"]},
                tool_state={},
            )
            ctx.state_put(AGENT, start)
        self.checkpoint(AGENT, "triage started", step=0)
        with self.step("tracked facts"):
            for key, kind, content in SCRIPT["facts"]:
                ctx.fact_register(sid, key=key, type=kind, content=content)
        task = self.task_start(sid)
        for turn, (user, assistant, tool, result) in enumerate(INCIDENT_TURNS, start=1):
            self.turn(sid, turn, user, assistant, tool, result)
            self.context_build(
                sid, {"input": "What is the next step?", "budget": DEMO_WINDOW, "system_parts": SYSTEM_PARTS}
            )
            if turn % 6 == 0:
                with self.step("fact reference"):
                    ctx.fact_reference(sid, self.fact_id(sid, "no_db_restart"), note=f"turn {turn}")
            milestone = SCRIPT["milestones"].get(str(turn))
            if milestone:
                reason, state = milestone["reason"], {k: v for k, v in milestone.items() if k != "reason"}
                self.checkpoint(AGENT, reason, step=turn, state=incident_state(**state))
            self.wait()
        self.task_finish(task)
        return sid

    def task_start(self, sid: str) -> dict[str, Any] | None:
        task = None
        with self.step("task"):
            task = self.ctx.task_create(
                session=sid,
                agent=AGENT,
                user_id="oncall-ana",
                title="Investigate checkout 502s",
                input="Checkout returns 502 since 09:14; find the cause and mitigate.",
                value_tier="high",
            )
            self.ctx.task_update(task["id"], status="running")
        return task

    def task_finish(self, task: dict[str, Any] | None) -> None:
        with self.step("task completion and distillation"):
            if task is None:
                raise_missing("task")
                return
            self.ctx.task_update(task["id"], status="succeeded", output=SCRIPT["task_output"])
            self.ctx.request("POST", f"/tasks/{task['id']}/distill", json={"mode": "full"})
        with self.step("experiences"):
            for item in EXTRA_EXPERIENCES:
                self.ctx.request("POST", "/experiences", json=item)
        self.wait(3)

    def crash_and_resume(self, sid: str) -> None:
        ctx = self.ctx
        with self.step("crash event"):
            ctx.event_emit(
                AGENT,
                "agent.crashed",
                {"reason": "OOMKilled while drafting the post-mortem", "exit_code": 137},
                session=sid,
            )
        self.wait(2)
        with self.step("recovered state"):
            recovered = ctx.recovered_state(AGENT, as_agent=AGENT)
            checkpoint = (recovered.get("checkpoint") or {}).get("seq")
            self.out(
                f"  recovered from checkpoint #{checkpoint}; "
                f"{len((recovered.get('session') or {}).get('messages', []))} recent messages"
            )
        with self.step("session end"):
            ctx.session_end(sid)
        resumed = ctx.session_create(
            AGENT,
            user_id="oncall-ana",
            model="gpt-4o-mini",
            metadata={"incident": f"INC-{self.run_id}", "resumed_from": sid},
        )
        self.checkpoint(AGENT, "resumed after crash", step=len(INCIDENT_TURNS) + 1)
        with self.step("user memories"):
            # What an operator records about the user; the resumed turns' "I prefer …" is
            # extracted on its own, and the second value of `oncall.role` supersedes the first.
            for subject, text, kind in SCRIPT["user_memories"]:
                ctx.user_memory_create("oncall-ana", subject, text, type=kind)
        self.conversation(resumed["id"], RESUME_TURNS, {"input": "Continue.", "budget": DEMO_WINDOW})

    def second_incident(self) -> None:
        doc = self.ctx.session_create("db-doctor", user_id="oncall-ben", model="gpt-4o")
        with self.step("experience search"):
            found = self.ctx.request(
                "POST",
                "/experiences/search",
                json={"query": "connection pool exhausted after canary deploy", "limit": 5},
            )
            hits = found.get("hits") or found.get("results") or found.get("items") or []
            self.out(f"  experience search: {len(hits)} hit(s)")
        self.conversation(doc["id"], DB_DOCTOR_TURNS, {"input": "Next?"})
        state = {
            "context": {"goal": "orders API healthy", "constraints": []},
            "observation": "pool 20/20 on orders-2",
            "decision": "roll back",
            "working_memory": {},
            "tool_state": {},
        }
        self.checkpoint("db-doctor", "rollback started", state=state)

    def turn(
        self, sid: str, turn: int, user: str, assistant: str, tool: dict[str, Any] | None, result: str
    ) -> None:
        turn_id = f"t{turn}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": user, "turn_id": turn_id}]
        if tool is not None:
            call_id = f"call_{self.run_id}_{turn}"
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "turn_id": turn_id,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": tool["name"], "arguments": json.dumps(tool["arguments"])},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "content": result, "turn_id": turn_id, "tool_call_id": call_id})
        messages.append({"role": "assistant", "content": assistant, "turn_id": turn_id})
        self.ctx.messages_append(sid, messages)

    def fact_id(self, sid: str, key: str) -> str:
        if (sid, key) not in self._fact_ids:
            for item in self.ctx.facts_list(sid).get("items", []):
                self._fact_ids[(sid, item.get("key"))] = item.get("id")
        return self._fact_ids[(sid, key)]


def raise_missing(what: str) -> None:
    raise NotFound(f"no {what} was created", code="not_found", status=404)


def main(args: argparse.Namespace) -> int:
    api_key = getattr(args, "api_key", None) or os.environ.get("CTXAPP_API_KEY")
    if not api_key:
        print(
            "ctxapp demo needs an API key: pass --api-key ctx_… or set CTXAPP_API_KEY.\n"
            f"`{command_name()} up` prints one on first run; or create one: "
            f"{command_name()} manage create_api_key --tenant demo",
            file=sys.stderr,
        )
        return 2
    pace_arg = getattr(args, "pace", None)
    pace = float(pace_arg if pace_arg is not None else os.environ.get("CTXAPP_DEMO_PACE") or DEFAULT_PACE)
    with Client(args.url, api_key, timeout=60) as client:
        try:
            return Demo(client, pace=pace).run()
        except Unauthorized:
            print("ctxapp demo: the API key was refused (unknown, revoked or expired).", file=sys.stderr)
            return 2
        except NetworkError as exc:
            print(
                f"ctxapp demo: cannot reach {args.url}: {exc.message}. Is `{command_name()} up` running?",
                file=sys.stderr,
            )
            return 2
        except CtxappError as exc:
            print(f"ctxapp demo: stopped: {exc.code}: {exc.message}", file=sys.stderr)
            return 1
