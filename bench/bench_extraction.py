"""Extraction of user memories: how good it is on the dev set, and what it costs an append.

    python bench/bench_extraction.py            # ~1 minute on a 2-core VM

Starts a throw-away embedded PostgreSQL (ctxapp.settings_test), creates the tables from the
models and measures, through the services (no HTTP):

1. quality on tests/data/dev/user_assistant_dev.json with the labels of extraction_labelled.json,
   replayed as the job runs it (dev_set_score): the share of extracted memories that are correct,
   the share of labelled memories found, and the share of fact changes after which the current
   view holds the new value and not the old one. Per split: u1-u3 (the rules were written on
   them) and u4-u6 (looked at only after the first figures, see docs/memory.md);
2. the SQL statements of one append with and without extraction queued, and the median append
   of one user message with extraction queued (a session with a user) and
   without (a session without a user, which queues nothing), interleaved, each append its own
   transaction so the after-commit dispatch is counted: a burst (the job pending, so appends
   coalesce into it) and the worst case (every append queues and dispatches a new job).
3. the added work alone, where the append's noise does not reach: the intent's INSERT timed in a
   server-side loop, and the after-commit hand-off to the dispatcher thread
   (`BENCH_ONLY=parts` runs only this; BENCH_APPENDS sets the pairs of 2).
Medians of repeated runs; the machine is shared, so read the difference side by side.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

django.setup()


class _NoMigrations(dict):
    """Tables straight from the models, as the test suite does (--nomigrations)."""

    def __contains__(self, item: object) -> bool:
        return True

    def __getitem__(self, item: str) -> None:
        return None


settings.MIGRATION_MODULES = _NoMigrations()

from django.db import transaction  # noqa: E402
from django.test.utils import setup_databases, setup_test_environment, teardown_databases  # noqa: E402

DEV = ROOT / "tests" / "data" / "dev"
APPENDS = int(os.environ.get("BENCH_APPENDS", "600"))


def quality(tenant) -> None:
    from memory.services.user_memory.dev_score import dev_set_score

    samples = json.loads((DEV / "user_assistant_dev.json").read_text(encoding="utf-8"))
    labelled = json.loads((DEV / "extraction_labelled.json").read_text(encoding="utf-8"))["turns"]
    print("quality (offline rules)            extracted  correct      labels found   changes held")
    for name, chosen in (
        ("u1-u3 (rules written on)", [s for s in samples if s["split"] == "rules"]),
        ("u4-u6 (looked at later)", [s for s in samples if s["split"] == "held-out"]),
        ("all six", samples),
    ):
        score = dev_set_score(tenant=tenant, samples=chosen, labelled=labelled)
        print(
            f"  {name:<30} {score.extracted:>6}  {score.precision:5.1f} %"
            f"   {score.labels_found:>3}/{score.labels:<3} {100 * score.labels_found / score.labels:5.1f} %"
            f"   {score.changes_held:>2}/{score.changes:<2} {score.change_accuracy:5.1f} %"
        )
        for line in score.wrong + score.missed_changes:
            print(f"      {line}")


def append_cost(tenant) -> None:
    from memory.models import JobIntent, JobStatus
    from memory.services.sessions import MessageInput, messages_append, session_open
    from memory.services.user_memory.extraction import EXTRACT_JOB

    with_user, _ = session_open(tenant=tenant, agent_external_id="bench", user_id="bench-user")
    without, _ = session_open(tenant=tenant, agent_external_id="bench", user_id="")

    def append(session, n: int) -> float:
        item = MessageInput(role="user", content=f"I live in Portland, and this is note {n} of the day.")
        started = time.perf_counter()
        with transaction.atomic():
            messages_append(tenant=tenant, session=session, items=[item])
        return time.perf_counter() - started

    for n in range(30):  # warm up: prepared statements, the broker connection
        append(with_user, n)
        append(without, n)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    statements = {}
    for name, session in (("with", with_user), ("without", without)):
        JobIntent.objects.filter(kind=EXTRACT_JOB, status=JobStatus.PENDING).update(status=JobStatus.DONE)
        with CaptureQueriesContext(connection) as captured:
            append(session, 0)
        statements[name] = len(captured.captured_queries)
    print(
        f"statements per append (a new job queued): with extraction {statements['with']},"
        f" without {statements['without']}"
    )
    for mode in ("burst", "worst"):
        timed: dict[str, list[float]] = {"with": [], "without": []}
        for n in range(APPENDS):
            if mode == "worst":  # the previous job was taken: this append queues and dispatches anew
                JobIntent.objects.filter(kind=EXTRACT_JOB, status=JobStatus.PENDING).update(
                    status=JobStatus.DONE
                )
            order = (
                (("with", with_user), ("without", without))
                if n % 2
                else (("without", without), ("with", with_user))
            )
            for name, session in order:
                timed[name].append(append(session, n))
        a, b = (statistics.median(timed[k]) * 1000 for k in ("with", "without"))
        paired = sorted((x - y) * 1000 for x, y in zip(timed["with"], timed["without"], strict=True))
        low, high = paired[len(paired) // 4], paired[3 * len(paired) // 4]
        print(
            f"append, {mode:<5}  median with extraction queued {a:6.3f} ms   without {b:6.3f} ms"
            f"   median paired difference {statistics.median(paired):+6.3f} ms"
            f" (quartiles {low:+.3f} / {high:+.3f})   n={APPENDS} pairs, interleaved"
        )
    print(f"  jobs queued: {JobIntent.objects.filter(kind=EXTRACT_JOB).count()}")
    part_cost(tenant, with_user)


def part_cost(tenant, session) -> None:
    """The added work itself, measured where the append's noise does not reach: the intent's
    INSERT run 2,000 times in one server-side loop (coalescing into a pending intent, and making a
    new one each time, for a new key), and the after-commit hand-off (a queue put) to the
    dispatcher thread."""
    import queue
    import timeit

    from django.db import connection

    from memory.services import jobs

    loops = 2000
    notices: list[str] = []
    connection.ensure_connection()
    connection.connection.add_notice_handler(lambda diag: notices.append(str(diag.message_primary)))
    for mode, key in (
        ("coalesced", f"'session:{session.pk}'"),  # the same key, its intent pending: no row
        ("new intent", "'session:bench-new-' || i"),  # a new key each time: a new row
    ):
        insert = jobs.job_intent_insert_sql(
            f"SELECT {int(tenant.pk)}, 'user_memory.extract', {key}, '{{}}'::jsonb, "
            "'pending', 0, '', now(), now()"
        ).replace("RETURNING id", "")
        block = f"""
            DO $$ DECLARE started timestamptz; total interval := '0';
            BEGIN
                FOR i IN 1..{loops} LOOP
                    started := clock_timestamp();
                    {insert};
                    total := total + (clock_timestamp() - started);
                END LOOP;
                RAISE NOTICE 'per insert %', round((extract(epoch from total) * 1e6 / {loops})::numeric, 2);
            END $$"""
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(block)
            transaction.set_rollback(True)
        print(
            f"intent INSERT in the server, {mode:<10}: {notices[-1].split('per insert')[-1].strip()} µs each"
        )
    waiting: queue.SimpleQueue[int] = queue.SimpleQueue()
    handoff = timeit.timeit(lambda: waiting.put(1), number=100_000) / 100_000 * 1e6
    print(f"after-commit hand-off (a queue put): {handoff:.2f} µs")


def main() -> None:
    setup_test_environment()
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        from memory.models import Tenant

        tenant = Tenant.objects.create(name="bench", slug="bench")
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        if os.environ.get("BENCH_ONLY") == "parts":  # the server-side part costs alone (seconds)
            from memory.services.sessions import session_open

            part_cost(tenant, session_open(tenant=tenant, agent_external_id="bench", user_id="u")[0])
            return
        quality(tenant)
        append_cost(tenant)
    finally:
        teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
