"""Recovery latency for an agent with 100,000 events and 1,000 checkpoints (goal: ≤ 1 s).

    python bench/bench_recovery.py [--events 100000] [--checkpoints 1000] [--runs 15]

Starts a throw-away embedded PostgreSQL (ctxapp.settings_test), builds one agent's history
(agent.step events folded by two declared reducers, message.added events of a session, a
checkpoint every events/checkpoints events, each of a ~5 KB state that changes a little), then
times GET /api/v1/agents/{agent}/recovered-state in-process (Django test client: the whole view
stack, no network) and the service call alone, and prints medians and per-part timings. For
comparison it also times a fold of the whole stream without the fold stored on checkpoints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402


def build(events: int, checkpoints: int) -> tuple[object, object, str]:
    from memory.models import Event, EventStream, Tenant
    from memory.services import cognition, recorder, recovery
    from memory.services.sessions import agent_get_or_create, session_create
    from memory.services.tenancy import api_key_create

    tenant = Tenant.objects.create(name="bench", slug="bench")
    _, secret = api_key_create(tenant=tenant, name="bench", scopes=None)
    agent = agent_get_or_create(tenant=tenant, external_id="bench-agent")
    session = session_create(tenant=tenant, agent_external_id="bench-agent")
    recovery.reducers_put(
        tenant=tenant,
        agent=agent,
        reducers=[
            recovery.Reducer("agent.step", "set", "progress.step", "step"),
            recovery.Reducer("agent.step", "merge", "latest", "result"),
        ],
    )
    per_checkpoint = max(1, events // checkpoints)
    memory = {f"fact_{i}": f"value {i} " + "x" * 40 for i in range(80)}
    step = 0
    started = time.perf_counter()
    key = recorder.stream_key(agent)
    otel = {"gen_ai.agent.id": agent.external_id, "gen_ai.conversation.id": session.public_id}
    for index in range(checkpoints):
        with transaction.atomic():
            count = per_checkpoint - 1  # the checkpoint's own event makes up the rest
            stream, _ = EventStream.objects.get_or_create(tenant=tenant, key=key)
            stream = EventStream.objects.select_for_update().get(pk=stream.pk)
            first = stream.last_seq + 1
            stream.last_seq += count
            stream.save(update_fields=["last_seq"])
            rows = []
            for _ in range(count):
                step += 1
                if step % 4 == 0:
                    rows.append(("message.added", {**otel, "seq": step, "role": "user", "tokens": 12}))
                else:
                    rows.append(("agent.step", {**otel, "step": step, "result": {"k": step % 7, "ok": True}}))
            Event.objects.bulk_create(
                [
                    Event(tenant=tenant, stream=key, seq=first + i, type=t, agent=agent, payload=p)
                    for i, (t, p) in enumerate(rows)
                ],
                batch_size=2000,
            )
        memory[f"fact_{index % 80}"] = f"updated at checkpoint {index}"
        cognition.checkpoint_create(
            tenant=tenant,
            agent=agent,
            reason="periodic",
            step=step,
            state={
                "schema_version": 1,
                "context": {"goal": "bench", "constraints": []},
                "working_memory": memory,
            },
        )
        if (index + 1) % 100 == 0:
            print(
                f"  built {index + 1} checkpoints, {Event.objects.filter(stream=key).count()} events",
                flush=True,
            )
    print(f"build: {time.perf_counter() - started:.1f} s")
    return tenant, agent, secret


def bare_agent(tenant: object, events: int) -> object:
    """An agent with `events` agent.step events and no checkpoint at all."""
    from memory.models import Event, EventStream
    from memory.services import recorder
    from memory.services.sessions import agent_get_or_create

    agent = agent_get_or_create(tenant=tenant, external_id="no-checkpoints")
    key = recorder.stream_key(agent)
    EventStream.objects.create(tenant=tenant, key=key, last_seq=events)
    payload = {"gen_ai.agent.id": agent.external_id}
    Event.objects.bulk_create(
        [
            Event(
                tenant=tenant,
                stream=key,
                seq=seq,
                type="agent.step",
                agent=agent,
                payload={**payload, "step": seq},
            )
            for seq in range(1, events + 1)
        ],
        batch_size=5000,
    )
    return agent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    settings.DATABASES["default"].setdefault("TEST", {})["MIGRATE"] = False
    old = setup_databases(verbosity=0, interactive=False)
    try:
        from rest_framework.test import APIClient

        from memory.models import Checkpoint, Event
        from memory.services import recovery

        tenant, agent, secret = build(args.events, args.checkpoints)
        print(
            f"agent history: {Event.objects.filter(agent=agent).count()} events, "
            f"{Checkpoint.objects.filter(agent=agent).count()} checkpoints"
        )
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}", HTTP_X_AGENT_ID="bench-agent")
        api_times, service_times, parts = [], [], []
        for _ in range(args.runs):
            started = time.perf_counter()
            response = client.get("/api/v1/agents/bench-agent/recovered-state")
            api_times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.content[:500]
            body = response.json()
            assert body["warnings"] == [], body["warnings"]
            started = time.perf_counter()
            result = recovery.recovered_state(tenant=tenant, agent=agent, caller=agent)
            service_times.append(time.perf_counter() - started)
            parts.append(result.parts)
        fold_times = []
        for _ in range(3):
            started = time.perf_counter()
            full = recovery.fold_full(tenant=tenant, agent=agent)
            fold_times.append(time.perf_counter() - started)
        assert full["custom"] == body["operational"]["custom"]
        no_checkpoints = bare_agent(tenant, args.events)
        attempts = []
        while True:
            started = time.perf_counter()
            result = recovery.recovered_state(tenant=tenant, agent=no_checkpoints, caller=no_checkpoints)
            attempts.append((time.perf_counter() - started, result.operational is not None))
            if attempts[-1][1] or len(attempts) > 20:
                break
        steady = []
        for _ in range(5):
            started = time.perf_counter()
            recovery.recovered_state(tenant=tenant, agent=no_checkpoints, caller=no_checkpoints)
            steady.append(time.perf_counter() - started)
        ms = lambda values: statistics.median(values) * 1000  # noqa: E731
        print(
            f"GET recovered-state (in-process API), median of {args.runs}: {ms(api_times):.1f} ms "
            f"(min {min(api_times) * 1000:.1f}, max {max(api_times) * 1000:.1f})"
        )
        print(f"recovered_state() service, median: {ms(service_times):.1f} ms")
        for name in parts[0]:
            print(f"  part {name:<12} median {statistics.median(p[name]['ms'] for p in parts):7.1f} ms")
        print(
            f"fold of the whole stream without stored folds ({full['event_count']} events), "
            f"median of 3: {ms(fold_times):.0f} ms"
        )
        print(
            f"agent with {args.events} events and no checkpoint: recoveries until the fold completed: "
            + ", ".join(
                f"{t * 1000:.0f} ms ({'complete' if ok else 'cut, progress kept'})" for t, ok in attempts
            )
            + f"; then median of 5: {ms(steady):.1f} ms"
        )
        print(
            f"document size: {len(response.content) / 1024:.1f} KiB; goal ≤ 1000 ms: "
            f"{'met' if ms(api_times) <= 1000 else 'MISSED'}"
        )
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
