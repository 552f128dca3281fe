# ruff: noqa: RUF001, RUF002, E501
"""Context build latency on sessions of 100 … 100,000 messages: cost must follow the window.

    python bench/bench_context_build.py [--builds 100] [--sizes 100,1000,10000,100000]

Starts a throw-away embedded PostgreSQL (ctxapp.settings_test), bulk-inserts each session's
messages (user / assistant / tool-call groups, ~40–400 characters each), then times
`context_build` (the service: window query, counting, fitting, BudgetSample + event insert, one
transaction) and the full HTTP path (DRF test client → POST /api/v1/sessions/{id}/context).
"full" includes the decay and retrieval hooks as their owners implemented them; "engine only"
replaces those hooks with no-ops to isolate the context engine's own cost. Sessions are measured
round-robin so background load on the shared machine hits every size alike.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")
    import django
    from django.conf import settings

    django.setup()
    from django.db import connection

    connection.settings_dict["TEST"].update({"NAME": "bench_ctx_build", "MIGRATE": False})
    settings.DATABASES["default"]["TEST"].update({"NAME": "bench_ctx_build", "MIGRATE": False})
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)


SENTENCES = [
    "The nightly import failed again with a connection timeout after 30 seconds.",
    "Let's add the composite index on (tenant_id, created_at) and re-run the query plan.",
    "I checked the logs: the worker restarted twice between 02:00 and 02:15 UTC.",
    "We decided to keep PostgreSQL 16 and move the reporting queries to a replica.",
    "Can you summarise what changed in the API since version 2.3?",
    "The budget for this quarter is 4,000 EUR; anything above needs approval from Dana.",
    "Here is the patch: `ALTER TABLE orders ADD COLUMN shipped_at timestamptz;`",
    "Tests pass locally but CI fails on the migration step with error 23505.",
]


def make_rows(tenant, session, n: int, rng: random.Random):
    from memory.models import Message
    from memory.services import tokens

    rows, seq = [], 0
    while seq < n:
        kind = rng.random()
        if kind < 0.15 and seq + 2 <= n:
            call_id = f"call_{seq}"
            call = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "sql", "arguments": '{"q": "select 1"}'},
                }
            ]
            rows.append(
                Message(
                    tenant=tenant,
                    session=session,
                    seq=seq + 1,
                    role="assistant",
                    content="",
                    tool_calls=call,
                    token_count=tokens.count_tokens(tokens.compact_json(call)),
                )
            )
            result = " ".join(rng.sample(SENTENCES, 2))
            rows.append(
                Message(
                    tenant=tenant,
                    session=session,
                    seq=seq + 2,
                    role="tool",
                    content=result,
                    tool_call_id=call_id,
                    token_count=tokens.count_tokens(result),
                )
            )
            seq += 2
            continue
        content = " ".join(rng.sample(SENTENCES, rng.randint(1, 5)))
        rows.append(
            Message(
                tenant=tenant,
                session=session,
                seq=seq + 1,
                role="user" if seq % 2 == 0 else "assistant",
                content=content,
                token_count=tokens.count_tokens(content),
            )
        )
        seq += 1
    Message.objects.bulk_create(rows, batch_size=5000)
    session.message_seq = session.message_count = n
    session.save(update_fields=["message_seq", "message_count"])
    # messages_append keeps decay's round counter; bulk_create bypasses it, so set it as it would be
    from memory.models import FactRoundCounter

    users = [r for r in rows if r.role == "user"]
    FactRoundCounter.objects.update_or_create(
        session=session,
        defaults={"tenant": tenant, "rounds": len(users), "last_user_seq": users[-1].seq if users else 0},
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--builds", type=int, default=100)
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    args = parser.parse_args()
    setup_django()
    from rest_framework.test import APIClient

    from memory.models import Tenant
    from memory.services.context import SystemPart, context_build
    from memory.services.sessions import session_create
    from memory.services.tenancy import api_key_create

    rng = random.Random(3)
    tenant = Tenant.objects.create(name="bench", slug="bench")
    _, secret = api_key_create(tenant=tenant, name="bench")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    parts = [
        SystemPart("core", "You are an operations assistant. " * 10),
        SystemPart("tools", "Use sql for queries."),
    ]
    sizes = [int(s) for s in args.sizes.split(",")]
    models = ("gpt-4o", "claude-sonnet-4")
    sessions = {}
    for size in sizes:
        for model in models:
            session = session_create(
                tenant=tenant, agent_external_id=f"bench-{size}-{model}", model_name=model
            )
            start = time.perf_counter()
            make_rows(tenant, session, size, rng)
            print(f"loaded {size:,} messages ({model}) in {time.perf_counter() - start:.1f}s", flush=True)
            sessions[(size, model)] = session
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    from memory.services import decay
    from memory.services import experience_search as retrieval

    real_hooks = (
        decay.facts_for_context,
        decay.facts_after_build,
        retrieval.experiences_for_context,
        retrieval.experiences_mark_used,
    )
    stub_hooks = (lambda **kw: [], lambda **kw: [], lambda **kw: [], lambda **kw: None)

    def set_hooks(hooks) -> None:
        (
            decay.facts_for_context,
            decay.facts_after_build,
            retrieval.experiences_for_context,
            retrieval.experiences_mark_used,
        ) = hooks

    timings: dict[tuple[int, str, str], list[float]] = {}
    # interleaved rounds: every session is measured under the same background load
    for i in range(args.builds + 3):
        for key, session in sessions.items():
            for mode in ("full", "engine", "http"):
                if mode == "http" and i % 4:
                    continue
                set_hooks(stub_hooks if mode == "engine" else real_hooks)
                start = time.perf_counter()
                if mode == "http":
                    response = client.post(
                        f"/api/v1/sessions/{session.public_id}/context",
                        {
                            "input": f"and then? ({i})",
                            "system_parts": {"core": "You are an operations assistant."},
                        },
                        format="json",
                    )
                    assert response.status_code == 200, response.content
                else:
                    context_build(
                        tenant=tenant,
                        session=session,
                        next_input=f"what should we do next? ({i})",
                        system_parts=parts,
                    )
                if i >= 3:  # the first rounds warm caches
                    timings.setdefault((*key, mode), []).append((time.perf_counter() - start) * 1000)
    set_hooks(real_hooks)

    print(
        "\n| messages in session | model (tokenizer) | full build p50 / p99 ms | engine only p50 / p99 ms | HTTP p50 / p99 ms |"
    )
    print("|---|---|---|---|---|")
    for size in sizes:
        for model in models:
            cells = [
                f"{statistics.median(t):.1f} / {pct(t, 0.99):.1f}"
                for t in (timings[(size, model, mode)] for mode in ("full", "engine", "http"))
            ]
            print(f"| {size:,} | {model} | {' | '.join(cells)} |")
    for model in models:
        for mode in ("full", "engine", "http"):
            small = statistics.median(timings[(sizes[0], model, mode)])
            large = statistics.median(timings[(sizes[-1], model, mode)])
            print(
                f"{model} {mode}: p50 at {sizes[-1]:,} ÷ p50 at {sizes[0]:,} messages = {large / small:.2f}× (goal ≤ 2×)"
            )


if __name__ == "__main__":
    main()
