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
from typing import Any

DEMO_WINDOW = {"max_input_tokens": 2000, "output_reserve": 256, "history_window": 60, "keep_verbatim": 4}
DEFAULT_PACE = 0.3  # seconds between turns, so a watcher sees panels move

INCIDENT_TURNS: list[tuple[str, str, dict[str, Any] | None, str]] = [
    # (user, assistant, tool call or None, tool result)
    (
        "Checkout is throwing 502s since 09:14. Can you take a look?",
        "On it. I'll start from the load balancer and the upstream pool of the checkout service.",
        {"name": "logs.search", "arguments": {"service": "lb-edge", "query": "status:502", "since": "09:00"}},
        "1,284 matches; 97 % from upstream checkout-web-3; first at 09:14:07.",
    ),
    (
        "Only web-3? The others look fine on the graph.",
        "Yes, web-3 answers 502 while web-1 and web-2 are healthy. Checking its connection pool.",
        {
            "name": "metrics.query",
            "arguments": {"expr": "db_pool_in_use{host='checkout-web-3'}", "range": "1h"},
        },
        "db_pool_in_use = 20/20 since 09:13; wait queue 340 requests.",
    ),
    (
        "So the pool is exhausted. Why only on web-3?",
        "web-3 got the 09:10 deploy first (canary). The new build opens a transaction per cart item.",
        {"name": "deploys.list", "arguments": {"service": "checkout", "since": "08:00"}},
        "09:10 checkout v2024.11.29-1 canary on web-3 (10 %); author: payments-team.",
    ),
    (
        "Can we just restart web-3?",
        "Restarting clears the pool for a few minutes only, and db-1 must not be restarted "
        "during business hours. "
        "A rollback of the canary is safer.",
        None,
        "",
    ),
    (
        "Agreed. What does the code change look like?",
        "The diff moves `reserve_stock()` inside the per-item loop, each with its own transaction.",
        {"name": "git.diff", "arguments": {"repo": "checkout", "ref": "v2024.11.29-1"}},
        "cart/service.py: +for item in cart.items: with atomic(): reserve_stock(item)",
    ),
    (
        "How many carts have more than 20 items right now?",
        "Let me count; large carts would hold 20+ connections each.",
        {
            "name": "sql.readonly",
            "arguments": {"db": "db-1-replica", "query": "select count(*) from carts where items > 20"},
        },
        "count = 17",
    ),
    (
        "That matches the wait queue. Roll back the canary.",
        "Rolling back web-3 to v2024.11.28-3.",
        {"name": "deploys.rollback", "arguments": {"service": "checkout", "host": "checkout-web-3"}},
        "rollback finished at 09:41:55; web-3 healthy.",
    ),
    (
        "Are the 502s gone?",
        "Checking the error rate after the rollback.",
        {"name": "metrics.query", "arguments": {"expr": "rate(lb_502_total[5m])", "range": "15m"}},
        "502 rate dropped from 41/s to 0 at 09:42.",
    ),
    (
        "Good. p95 latency?",
        "p95 is back to 210 ms, under the 300 ms goal.",
        {
            "name": "metrics.query",
            "arguments": {"expr": "histogram_quantile(0.95, checkout_latency)", "range": "15m"},
        },
        "p95 = 210 ms",
    ),
    (
        "Write up the cause for the payments team, bullet points please.",
        "- Cause: v2024.11.29-1 opens one transaction per cart item\n"
        "- Effect: pool of 20 exhausted by carts > 20 items on the canary host\n"
        "- Fix: rollback; batch reserve_stock() in one transaction before re-deploying",
        None,
        "",
    ),
    (
        "Also raise the pool size on web-3 to be safe?",
        "Raising the pool only hides the bug; I'd keep 20 and add an alert on db_pool_wait_queue > 50.",
        {"name": "alerts.create", "arguments": {"expr": "db_pool_wait_queue > 50", "for": "2m"}},
        "alert checkout-pool-wait created",
    ),
    (
        "Any customer impact numbers?",
        "Estimating failed checkouts between 09:14 and 09:42.",
        {
            "name": "sql.readonly",
            "arguments": {"db": "analytics", "query": "select count(*) from checkout_failed ..."},
        },
        "count = 1,912 failed checkouts; 74 % retried successfully.",
    ),
    (
        "Post an update in #incidents.",
        "Posted: mitigated at 09:42 by rolling back the checkout canary; root cause known; "
        "follow-up owner payments-team.",
        {"name": "chat.post", "arguments": {"channel": "#incidents", "text": "Checkout 502s mitigated ..."}},
        "message posted",
    ),
    (
        "Can you double check the replica lag during the incident?",
        "Replica lag stayed under 200 ms, so the read-only queries above were accurate.",
        {"name": "metrics.query", "arguments": {"expr": "pg_replication_lag_seconds", "range": "1h"}},
        "max lag 0.18 s",
    ),
    (
        "What about the background workers, were they affected?",
        "Workers use a separate pool (db-workers, size 10); no errors there.",
        {"name": "metrics.query", "arguments": {"expr": "worker_errors_total", "range": "1h"}},
        "0 errors",
    ),
    (
        "Let's schedule the post-mortem.",
        "Scheduled for tomorrow 11:00 with payments-team and SRE; draft timeline attached.",
        {"name": "calendar.create", "arguments": {"title": "PM: checkout 502s", "when": "tomorrow 11:00"}},
        "event created",
    ),
    (
        "One more: is the canary process documented somewhere?",
        "Yes: runbooks/deploy/canary.md; it lacks a pool-saturation check, I'll propose one.",
        None,
        "",
    ),
    ("Did the alert fire since?", "No, the pool wait queue stayed at 0 since the rollback.", None, ""),
    (
        "How many hosts run the old build now?",
        "All three checkout hosts run v2024.11.28-3.",
        {"name": "deploys.status", "arguments": {"service": "checkout"}},
        "web-1, web-2, web-3: v2024.11.28-3",
    ),
    ("Is the payments team aware?", "Yes, they acknowledged in the thread and own the fix.", None, ""),
    (
        "Close the incident channel in an hour.",
        "Reminder set for 10:45.",
        {"name": "reminders.create", "arguments": {"at": "10:45", "text": "close incident channel"}},
        "reminder set",
    ),
    (
        "Thanks. Anything else before we close?",
        "Only the follow-ups: batch reserve_stock(), add the pool alert to the canary checklist, "
        "post-mortem tomorrow.",
        None,
        "",
    ),
]

RESUME_TURNS: list[tuple[str, str]] = [
    (
        "Are you back? You stopped answering.",
        "I crashed while drafting the post-mortem and resumed from checkpoint "
        "'cause identified, canary rolled back'. "
        "The incident is mitigated; I'm continuing with the follow-ups.",
    ),
    (
        "Please finish the post-mortem draft.",
        "Draft ready: timeline 09:10 canary → 09:14 first 502 → 09:41 rollback → 09:42 recovered; "
        "cause; follow-ups.",
    ),
    ("And remember: bullet points.", "- Timeline added\n- Cause added\n- 3 follow-ups with owners"),
]

DB_DOCTOR_TURNS: list[tuple[str, str]] = [
    (
        "Orders API times out on checkout since the morning deploy. Seen this before?",
        "Searching past experiences… a similar incident today: pool exhausted by a per-item transaction.",
    ),
    (
        "Could be the same pattern. What should I check?",
        "Check db_pool_in_use on the canary host and the diff for transactions opened in a loop.",
    ),
    (
        "Pool is at 20/20 on orders-2. Rolling back.",
        "Good call; the stored solution says to batch the work in one transaction.",
    ),
]

EXTRA_EXPERIENCES: list[dict[str, Any]] = [
    {
        "problem": "Postgres replica lag above 30 s during nightly vacuum",
        "cause": "autovacuum on the 400 GB events table saturates disk I/O on the replica",
        "solution": "Partition the events table by month and vacuum partitions; "
        "cap autovacuum_vacuum_cost_limit",
        "confidence": 0.7,
    },
    {
        "problem": "Redis evictions spike after the session TTL change",
        "cause": "maxmemory-policy allkeys-lru with TTL raised from 1 h to 24 h",
        "solution": "Restore 1 h TTL for anonymous sessions; size Redis for 24 h logged-in sessions only",
        "confidence": 0.6,
    },
    {
        "problem": "Checkout 502s on one host after a canary deploy",
        "cause": "connection pool exhausted by one transaction per cart item",
        "solution": "Roll back the canary; batch reserve_stock() in one transaction; "
        "alert on pool wait queue",
        "confidence": 0.9,
    },
]


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
        from ctxapp.client import CtxappError, NotFound, Unauthorized

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

    # --- the story ------------------------------------------------------------------------------
    def run(self) -> int:
        ctx = self.ctx
        tenant = ctx.request("GET", "/tenant")
        self.out(f"ctxapp demo: tenant {tenant['name']!r} (key {tenant['key_prefix']}…), run {self.run_id}")
        agent = "ops-copilot"
        self.out("Incident 1: checkout 502s (agent ops-copilot)")
        session = ctx.session_create(
            agent,
            user_id="oncall-ana",
            model="gpt-4o-mini",
            metadata={"incident": f"INC-{self.run_id}", "demo": True},
        )
        sid = session["id"]
        self.out(f"  session {sid}")
        with self.step("cognitive state"):
            ctx.state_put(
                agent,
                {
                    "context": {
                        "goal": "restore checkout p95 < 300 ms",
                        "constraints": ["no db-1 restart in business hours"],
                    },
                    "observation": "502s on checkout since 09:14",
                    "working_memory": {"suspects": ["lb", "web-3"]},
                    "decision": None,
                    "tool_state": {},
                },
            )
        with self.step("checkpoint"):
            ctx.checkpoint_create(agent, reason="triage started", step=0)
        facts = [
            ("no_db_restart", "constraint", "Never restart db-1 during business hours (08:00-20:00)."),
            ("goal_latency", "goal", "Restore checkout p95 latency below 300 ms."),
            ("answer_style", "user_preference", "Ana wants answers as bullet points."),
            ("primary_db", "critical_info", "The primary database is db-1; db-1-replica is read-only."),
            ("pool_size", "state", "checkout-web-3 pool size is 20 connections."),
            ("canary_share", "progress", "The canary takes 10 % of traffic on web-3."),
            ("slack_channel", "note", "Updates go to #incidents."),
            ("escalation_owner", "decision", "Escalations go to the SRE-EU duty manager, Ravi."),
            (
                "breakglass_account",
                "critical_info",
                "The break-glass VPN account is ops-breakglass (vault path ops/bg).",
            ),
        ]
        with self.step("tracked facts"):
            for key, kind, content in facts:
                ctx.fact_register(sid, key=key, type=kind, content=content)
        task = None
        with self.step("task"):
            task = ctx.task_create(
                session=sid,
                agent=agent,
                user_id="oncall-ana",
                title="Investigate checkout 502s",
                input="Checkout returns 502 since 09:14; find the cause and mitigate.",
                value_tier="high",
            )
            ctx.task_update(task["id"], status="running")

        for turn, (user, assistant, tool, result) in enumerate(INCIDENT_TURNS, start=1):
            self.turn(sid, turn, user, assistant, tool, result)
            with self.step("context build"):
                ctx.request(
                    "POST",
                    f"/sessions/{sid}/context",
                    json={
                        "input": "What is the next step?",
                        "budget": DEMO_WINDOW,
                        "system_parts": [
                            {
                                "name": "core",
                                "content": "You are ops-copilot, an SRE assistant.",
                                "critical": True,
                            }
                        ],
                    },
                )
            if turn % 6 == 0:
                with self.step("fact reference"):
                    ctx.fact_reference(sid, self.fact_id(sid, "no_db_restart"), note=f"turn {turn}")
            if turn == 4:
                with self.step("checkpoint"):
                    ctx.checkpoint_create(
                        agent,
                        reason="hypothesis: pool exhausted by canary",
                        step=turn,
                        state={
                            "context": {
                                "goal": "restore checkout p95 < 300 ms",
                                "constraints": ["no db-1 restart in business hours"],
                            },
                            "observation": "web-3 pool 20/20, wait queue 340",
                            "decision": "roll back canary",
                            "working_memory": {"suspects": ["canary v2024.11.29-1"], "hosts": ["web-3"]},
                            "tool_state": {"last_tool": "deploys.list"},
                        },
                    )
            if turn == 8:
                with self.step("checkpoint"):
                    ctx.checkpoint_create(
                        agent,
                        reason="cause identified, canary rolled back",
                        step=turn,
                        state={
                            "context": {
                                "goal": "restore checkout p95 < 300 ms",
                                "constraints": ["no db-1 restart in business hours"],
                            },
                            "observation": "502 rate 0/s after rollback",
                            "decision": "monitor, then write up",
                            "working_memory": {
                                "cause": "per-item transactions exhaust the pool",
                                "hosts": ["web-3"],
                                "mitigated_at": "09:42",
                            },
                            "tool_state": {"last_tool": "metrics.query"},
                        },
                    )
            self.wait()

        with self.step("task completion and distillation"):
            if task is None:
                raise_missing("task")
            ctx.task_update(
                task["id"],
                status="succeeded",
                output=(
                    "Cause: checkout v2024.11.29-1 opened one transaction per cart item, exhausting the "
                    "20-connection pool on canary host web-3 for carts over 20 items. "
                    "Mitigation: rolled back the canary at 09:41. "
                    "Solution: batch reserve_stock() in one transaction; alert on db_pool_wait_queue > 50."
                ),
            )
            ctx.request("POST", f"/tasks/{task['id']}/distill", json={"mode": "full"})
        with self.step("experiences"):
            for item in EXTRA_EXPERIENCES:
                ctx.request("POST", "/experiences", json={**item, "extraction_method": "manual"})
        self.wait(3)

        self.out("Crash and recovery")
        with self.step("crash event"):
            ctx.event_emit(
                agent,
                "agent.crashed",
                {"reason": "OOMKilled while drafting the post-mortem", "exit_code": 137},
                session=sid,
            )
        self.wait(2)
        recovered: dict[str, Any] = {}
        with self.step("recovered state"):
            recovered = ctx.recovered_state(agent, as_agent=agent)
            checkpoint = (recovered.get("checkpoint") or {}).get("seq")
            self.out(
                f"  recovered from checkpoint #{checkpoint}; "
                f"{len((recovered.get('session') or {}).get('messages', []))} recent messages"
            )
        with self.step("session end"):
            ctx.session_end(sid)
        resumed = ctx.session_create(
            agent,
            user_id="oncall-ana",
            model="gpt-4o-mini",
            metadata={"incident": f"INC-{self.run_id}", "resumed_from": sid},
        )
        rid = resumed["id"]
        with self.step("checkpoint"):
            ctx.checkpoint_create(agent, reason="resumed after crash", step=len(INCIDENT_TURNS) + 1)
        for turn, (user, assistant) in enumerate(RESUME_TURNS, start=1):
            self.turn(rid, turn, user, assistant, None, "")
            with self.step("context build"):
                ctx.request(
                    "POST", f"/sessions/{rid}/context", json={"input": "Continue.", "budget": DEMO_WINDOW}
                )
            self.wait()

        self.out("Incident 2: orders API timeouts (agent db-doctor)")
        doc = ctx.session_create("db-doctor", user_id="oncall-ben", model="gpt-4o")
        with self.step("experience search"):
            found = ctx.request(
                "POST",
                "/experiences/search",
                json={"query": "connection pool exhausted after canary deploy", "limit": 5},
            )
            hits = found.get("hits") or found.get("results") or found.get("items") or []
            self.out(f"  experience search: {len(hits)} hit(s)")
        for turn, (user, assistant) in enumerate(DB_DOCTOR_TURNS, start=1):
            self.turn(doc["id"], turn, user, assistant, None, "")
            with self.step("context build"):
                ctx.request("POST", f"/sessions/{doc['id']}/context", json={"input": "Next?"})
            self.wait()
        with self.step("checkpoint"):
            ctx.checkpoint_create(
                "db-doctor",
                reason="rollback started",
                state={
                    "context": {"goal": "orders API healthy", "constraints": []},
                    "observation": "pool 20/20 on orders-2",
                    "decision": "roll back",
                    "working_memory": {},
                    "tool_state": {},
                },
            )

        self.out(
            f"Done: {len(self.done)} steps ran, {len(self.skipped)} skipped"
            + (f" ({', '.join(sorted(set(self.skipped)))})" if self.skipped else "")
            + "."
        )
        return 0

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
    from ctxapp.client import NotFound

    raise NotFound(f"no {what} was created", code="not_found", status=404)


def main(args: argparse.Namespace) -> int:
    from ctxapp.cli import command_name
    from ctxapp.client import Client, CtxappError, NetworkError, Unauthorized

    api_key = getattr(args, "api_key", None) or os.environ.get("CTXAPP_API_KEY")
    if not api_key:
        print(
            "ctxapp demo needs an API key: pass --api-key ctx_… or set CTXAPP_API_KEY.\n"
            "`ctxapp up` prints one on first run; or create one: "
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
                f"ctxapp demo: cannot reach {args.url}: {exc.message}. Is `ctxapp up` running?",
                file=sys.stderr,
            )
            return 2
        except CtxappError as exc:
            print(f"ctxapp demo: stopped: {exc.code}: {exc.message}", file=sys.stderr)
            return 1
