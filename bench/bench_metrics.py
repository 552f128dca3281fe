"""GET /metrics scrape time against a populated database (the series are computed at scrape time).

    python bench/bench_metrics.py [--builds 100000] [--events 500000] [--experiences 20000]

Fills BudgetSample, Event and Experience rows with SQL (generate_series), then times
`ctxapp.metrics.metrics_text()` (every database query of a scrape, plus the broker's queue depth)
20 times and prints the median and the worst.
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

from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, setup_test_environment, teardown_databases  # noqa: E402


def fill(tenant_id: int, session_id: int, builds: int, events: int, experiences: int) -> None:
    from memory.models import BudgetSample, Event, Experience

    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {BudgetSample._meta.db_table} (tenant_id, session_id, public_id, created_at,"
            " model_name, tokenizer, exact, prompt_tokens, demand_tokens, input_limit, output_reserve,"
            " threshold_tokens,"
            " utilisation, components, manifest, warnings, forecast, summarisation_queued)"
            " SELECT %s, %s, 'ctx_b' || g, now(), 'm', 't', true, (g %% 60000), (g %% 60000), 64000, 4096,"
            " 54400, (g %% 60000) / 64000.0, '{}', '{}', '[]', '{}', false FROM generate_series(1, %s) g",
            [tenant_id, session_id, builds],
        )
        types = ["message.added", "context.built", "fact.decayed", "experience.embedded", "summary.created"]
        cursor.execute(
            f"INSERT INTO {Event._meta.db_table}"
            " (tenant_id, public_id, stream, seq, type, payload, created_at)"
            " SELECT %s, 'evt_b' || g, 'bench', g, (%s::text[])[1 + g %% 5], '{}', now()"
            " FROM generate_series(1, %s) g",
            [tenant_id, types, events],
        )
        cursor.execute(
            f"INSERT INTO {Experience._meta.db_table}"
            " (tenant_id, public_id, user_id, scope, kind, key, problem, cause, solution, confidence,"
            " extraction_method, provenance, text_hash, embedding_model, embedding_status, embedding_error,"
            " embedding_attempts, use_count, helpful_count, unhelpful_count, merge_count, created_at,"
            " updated_at)"
            " SELECT %s, 'exp_b' || g, '', 'tenant', 'experience', '', 'problem ' || g, '', '', 0.5,"
            " 'manual',"
            " '[]', md5(g::text), '', CASE WHEN g %% 10 = 0 THEN 'pending' ELSE 'completed' END, '', 0,"
            " g %% 7, 0, 0, 0, now(), now() FROM generate_series(1, %s) g",
            [tenant_id, experiences],
        )
        cursor.execute("ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--builds", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--experiences", type=int, default=20_000)
    args = parser.parse_args()
    setup_test_environment()
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        from ctxapp.metrics import metrics_text
        from memory.models import Tenant
        from memory.services.sessions import session_create

        tenant = Tenant.objects.create(name="bench", slug="bench")
        session = session_create(tenant=tenant, agent_external_id="bench")
        start = time.perf_counter()
        fill(tenant.pk, session.pk, args.builds, args.events, args.experiences)
        print(f"filled {args.builds:,} builds, {args.events:,} events, {args.experiences:,} experiences "
              f"in {time.perf_counter() - start:.1f} s")  # fmt: skip
        metrics_text()  # warm up (broker connection)
        times = []
        for _ in range(20):
            start = time.perf_counter()
            body = metrics_text()
            times.append((time.perf_counter() - start) * 1000)
        median, worst = statistics.median(times), max(times)
        print(f"scrape: {len(body):,} bytes, median {median:.1f} ms, worst {worst:.1f} ms")
    finally:
        teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
