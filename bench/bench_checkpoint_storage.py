"""Checkpoint storage: 1,000 checkpoints of a 50 KB state changing 1 % per step, vs naive full snapshots.

    python bench/bench_checkpoint_storage.py [--checkpoints 1000] [--turns 500]

Part 1 (in the database, through memory.services.cognition with the default policy, a full
snapshot every 20): bytes stored in checkpoint payloads and the table's size on disk, against
1,000 full copies; time to take a checkpoint and to reconstruct the deepest delta.
Part 2 (pure Python, the same storage function): the full-snapshot interval K = 1, 5, 10, 20, 50.
Part 3 (in the database): a state that *grows* each turn (a conversation history appended to,
the case where other checkpoint stores report quadratic growth, e.g. 219 MB at 500 turns), naive
total vs ours.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

MB = 1024 * 1024


def fifty_kb_state(rng: random.Random) -> dict[str, Any]:
    """~50 KB: 500 working-memory entries of ~100 bytes."""
    return {
        "schema_version": 1,
        "context": {"goal": "storage benchmark", "constraints": ["1 % changes per step"]},
        "observation": {"tick": 0},
        "working_memory": {f"entry_{i:03d}": "".join(rng.choices("abcdefghij", k=90)) for i in range(500)},
        "decision": None,
        "tool_state": {},
    }


def mutate(state: dict[str, Any], rng: random.Random, step: int) -> None:
    """Change 1 % of the entries (5 of 500) and the tick."""
    for key in rng.sample(sorted(state["working_memory"]), 5):
        state["working_memory"][key] = "".join(rng.choices("abcdefghij", k=90))
    state["observation"]["tick"] = step


def table_bytes() -> int:
    from memory.models import Checkpoint

    with connection.cursor() as cursor:
        if not connection.in_atomic_block:
            cursor.execute("VACUUM ANALYZE " + Checkpoint._meta.db_table)
        cursor.execute("SELECT pg_total_relation_size(%s)", [Checkpoint._meta.db_table])
        return int(cursor.fetchone()[0])


def part1(count: int) -> None:
    from memory.models import Checkpoint, Tenant
    from memory.services import cognition
    from memory.services.sessions import agent_get_or_create

    tenant = Tenant.objects.create(name="storage", slug="storage")
    agent = agent_get_or_create(tenant=tenant, external_id="storage-agent")
    rng = random.Random(1)
    state = fifty_kb_state(rng)
    times = []
    for step in range(count):
        mutate(state, rng, step)
        started = time.perf_counter()
        cognition.checkpoint_create(tenant=tenant, agent=agent, reason="step", step=step, state=state)
        times.append(time.perf_counter() - started)
    rows = list(Checkpoint.objects.filter(agent=agent).values_list("storage", "payload", "state_bytes"))
    ours = sum(len(p.encode()) for _, p, _ in rows)
    naive = sum(b for _, _, b in rows)
    deltas = [len(p.encode()) for s, p, _ in rows if s == "delta"]
    deepest = Checkpoint.objects.filter(agent=agent).order_by("-delta_depth", "-seq").first()
    rebuild = []
    for _ in range(20):
        started = time.perf_counter()
        cognition.checkpoint_state(checkpoint=deepest)
        rebuild.append(time.perf_counter() - started)
    disk = table_bytes()
    print(
        f"Part 1: {count} checkpoints of a {naive / count / 1024:.1f} KB state, 1 % changed per step, K = 20"
    )
    print(f"  naive full snapshots:   {naive / MB:8.2f} MB")
    print(f"  ours (payload bytes):   {ours / MB:8.2f} MB  ({naive / ours:.1f}x smaller)")
    print(
        f"  checkpoint table on disk (TOAST-compressed, incl. indexes and stored folds): {disk / MB:.2f} MB"
    )
    print(
        f"  full snapshots: {sum(1 for s, _, _ in rows if s == 'full')}, deltas: {len(deltas)} "
        f"(median {statistics.median(deltas) / 1024:.2f} KB)"
    )
    print(
        f"  checkpoint_create median {statistics.median(times) * 1000:.1f} ms; "
        f"reconstruct the deepest delta (depth {deepest.delta_depth}) median "
        f"{statistics.median(rebuild) * 1000:.1f} ms"
    )


def part2(count: int) -> None:
    from memory.services import cognition

    print("Part 2: full-snapshot interval K (same states, payload bytes, pure Python)")
    for every in (1, 5, 10, 20, 50):
        rng = random.Random(1)
        state = fifty_kb_state(rng)
        total, previous_state, previous = 0, None, None

        class Prev:  # the two fields checkpoint_storage_for reads
            def __init__(self, seq: int, depth: int) -> None:
                self.seq, self.delta_depth = seq, depth

        for step in range(count):
            mutate(state, rng, step)
            document = cognition.state_normalize(state)[0]
            _, _, depth, payload = cognition.storage.checkpoint_storage_for(
                state=document, previous=previous, previous_state=previous_state, full_every=every
            )
            total += len(payload.encode())
            previous, previous_state = Prev(step, depth), json.loads(json.dumps(document))
        print(f"  K = {every:>2}: {total / MB:7.2f} MB; a read applies at most {every - 1} deltas")


def part3(turns: int) -> None:
    from memory.models import Checkpoint, Tenant
    from memory.services import cognition
    from memory.services.sessions import agent_get_or_create

    tenant = Tenant.objects.create(name="growing", slug="growing")
    agent = agent_get_or_create(tenant=tenant, external_id="chat-agent")
    rng = random.Random(2)
    history: list[dict[str, str]] = []
    for turn in range(turns):
        history.append(
            {
                "role": "user" if turn % 2 == 0 else "assistant",
                "content": "".join(rng.choices("abcdefghij ", k=1700)),
            }
        )
        state = {"schema_version": 1, "working_memory": {"messages": history, "turn": turn}}
        cognition.checkpoint_create(tenant=tenant, agent=agent, reason="turn", step=turn, state=state)
    rows = list(Checkpoint.objects.filter(agent=agent).values_list("payload", "state_bytes"))
    ours = sum(len(p.encode()) for p, _ in rows)
    naive = sum(b for _, b in rows)
    print(
        f"Part 3: a conversation state growing ~1.7 KB per turn, {turns} turns "
        f"(final state {rows[-1][1] / MB:.2f} MB)"
    )
    print(f"  naive full snapshots: {naive / MB:8.1f} MB (quadratic)")
    print(
        f"  ours:                 {ours / MB:8.1f} MB ({naive / ours:.1f}x smaller; full snapshots every 20 "
        f"dominate: {sum(1 for p, _ in rows if p.startswith('{'))} of them)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=500)
    args = parser.parse_args()
    settings.DATABASES["default"].setdefault("TEST", {})["MIGRATE"] = False
    old = setup_databases(verbosity=0, interactive=False)
    try:
        part1(args.checkpoints)
        part2(args.checkpoints)
        part3(args.turns)
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
