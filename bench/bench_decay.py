"""Decay and compression: what tracking facts costs each append, how well references are found.

    python bench/bench_decay.py            # ~1 minute on a 2-core VM

Starts a throw-away embedded PostgreSQL (ctxapp.settings_test), creates the tables from the
models and measures, through the services (no HTTP):

1. append latency of one user message (messages_append, which calls facts_observe_messages)
   with 0, 10 and 50 tracked facts: a message sharing no term with any fact, and one sharing a
   term without reaching the overlap threshold (the case that embeds the message);
2. reference detection on a small hand-labelled set (mentions, paraphrases, unrelated messages
   that share a word): key terms alone vs key terms + MiniLM similarity;
3. the decay report of a session with 200 facts;
4. compressing a 1,000-message history to 0.3.
Medians of repeated runs; the machine is shared, so read ratios rather than absolute numbers.
"""

from __future__ import annotations

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


class _NoMigrations(dict):  # type: ignore[type-arg]
    """Tables straight from the models, as the test suite does (--nomigrations)."""

    def __contains__(self, item: object) -> bool:
        return True

    def __getitem__(self, item: str) -> None:
        return None


settings.MIGRATION_MODULES = _NoMigrations()

from django.test.utils import setup_databases, setup_test_environment, teardown_databases  # noqa: E402

LABELLED = [
    # (fact, message, is a reference)
    ("Budget limit is forty thousand euros", "Remember the budget limit of forty thousand euros.", True),
    ("Budget limit is forty thousand euros", "Stay under the forty thousand euro limit.", True),
    ("Budget limit is forty thousand euros", "The budget meeting is on Monday.", False),
    ("Migrate the billing service to PostgreSQL", "Move billing from MySQL to Postgres.", True),
    ("Migrate the billing service to PostgreSQL", "The billing page has a typo.", False),
    ("Migrate the billing service to PostgreSQL", "How far is the PostgreSQL migration of billing?", True),
    ("Use Redis for session caching", "Cache sessions in Redis.", True),
    ("Use Redis for session caching", "The Redis cluster went down today.", False),
    ("The user wants every answer in French", "Please reply in French from now on.", True),
    ("The user wants every answer in French", "French fries are tasty.", False),
    ("Never store card numbers in logs", "Do not log credit card numbers.", True),
    ("Never store card numbers in logs", "The logs rotate every night.", False),
    ("Deploy only on Tuesdays after the standup", "Can we deploy today? It is Tuesday.", True),
    ("Deploy only on Tuesdays after the standup", "The deploy script prints too much.", False),
    ("API responses must stay under 200 ms", "Keep response latency below 200 milliseconds.", True),
    ("API responses must stay under 200 ms", "The API docs need a new example.", False),
]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def bench_append(tenant) -> None:  # type: ignore[no-untyped-def]
    from memory.services import decay
    from memory.services.sessions import MessageInput, messages_append, session_create

    # Time spent inside the decay hook, apart from the whole append (the machine is shared, so
    # the share of the append is the steadier figure).
    inner: list[float] = []
    observe = decay.facts_observe_messages

    def timed_observe(**kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        observe(**kwargs)
        inner.append(time.perf_counter() - start)

    decay.facts_observe_messages = timed_observe  # type: ignore[assignment]
    print("1. one user message appended (median of 60, ms): whole append / inside the decay hook")
    print("   facts | no shared term      | one shared term (embeds the message)")
    try:
        for count in (0, 10, 50):
            session = session_create(tenant=tenant, agent_external_id=f"bench-{count}")
            messages_append(
                tenant=tenant, session=session, items=[MessageInput(role="user", content="Start.")]
            )
            for i in range(count):
                decay.fact_register(
                    tenant=tenant,
                    session=session,
                    key=f"k{i}",
                    fact_type="constraint" if i % 2 else "note",
                    content=f"Service number {i} must keep its quota table warm",
                )
            outer: dict[str, list[float]] = {"plain": [], "shared": []}
            hook: dict[str, list[float]] = {"plain": [], "shared": []}
            for i in range(60):
                for kind, text in (
                    ("plain", f"Go on with item {i}."),
                    ("shared", f"The quota page {i} looks odd."),
                ):
                    start = time.perf_counter()
                    messages_append(
                        tenant=tenant, session=session, items=[MessageInput(role="user", content=text)]
                    )
                    outer[kind].append(time.perf_counter() - start)
                    hook[kind].append(inner[-1])
            cells = [f"{median_ms(outer[k]):6.2f} / {median_ms(hook[k]):5.2f}" for k in ("plain", "shared")]
            print(f"   {count:5d} | {cells[0]:19s} | {cells[1]}")
    finally:
        decay.facts_observe_messages = observe  # type: ignore[assignment]


def bench_detection(tenant) -> None:  # type: ignore[no-untyped-def]
    from memory.models import DecayPolicy, FactReference
    from memory.services import decay
    from memory.services.sessions import MessageInput, messages_append, session_create

    print("2. reference detection on", len(LABELLED), "labelled pairs")
    for use_embeddings in (False, True):
        policy = DecayPolicy.for_tenant(tenant)
        policy.reference_use_embeddings = use_embeddings
        policy.save()
        tp = fp = fn = tn = 0
        for index, (fact_text, message, expected) in enumerate(LABELLED):
            session = session_create(tenant=tenant, agent_external_id=f"detect-{use_embeddings}-{index}")
            messages_append(
                tenant=tenant, session=session, items=[MessageInput(role="user", content="Start.")]
            )
            fact = decay.fact_register(
                tenant=tenant, session=session, key="fact", fact_type="constraint", content=fact_text
            ).fact
            messages_append(
                tenant=tenant, session=session, items=[MessageInput(role="user", content=message)]
            )
            found = FactReference.objects.filter(fact=fact).exclude(method="registered").exists()
            tp += found and expected
            fp += found and not expected
            fn += (not found) and expected
            tn += (not found) and not expected
        label = "key terms + embeddings" if use_embeddings else "key terms only        "
        print(f"   {label}: found {tp}/{tp + fn} references, {fp} false of {fp + tn} unrelated")


def bench_report(tenant) -> None:  # type: ignore[no-untyped-def]
    from memory.services import decay
    from memory.services.sessions import MessageInput, messages_append, session_create

    session = session_create(tenant=tenant, agent_external_id="report")
    messages_append(tenant=tenant, session=session, items=[MessageInput(role="user", content="Start.")])
    for i in range(200):
        decay.fact_register(
            tenant=tenant, session=session, key=f"k{i}", fact_type="goal", content=f"Goal {i} of the plan"
        )
    messages_append(
        tenant=tenant,
        session=session,
        items=[MessageInput(role="user", content=f"Round {i}.") for i in range(30)],
    )
    timings = []
    for _ in range(20):
        start = time.perf_counter()
        current, statuses = decay.facts_list(tenant=tenant, session=session, decayed=True)
        timings.append(time.perf_counter() - start)
    print(
        f"3. decay report, 200 facts ({len(statuses)} decayed at round {current}): "
        f"{median_ms(timings):.1f} ms"
    )


def bench_compression(tenant) -> None:  # type: ignore[no-untyped-def]
    from memory.services import history_compression as compression
    from memory.services.sessions import MessageInput, messages_append, session_create

    session = session_create(tenant=tenant, agent_external_id="compress")
    items = []
    for i in range(1000):
        if i % 25 == 0:
            items.append(
                MessageInput(role="assistant", content=f"Decision {i}: use plan {i}.", event_kind="decision")
            )
        elif i % 10 == 0:
            items.append(
                MessageInput(role="tool", tool_call_id=f"c{i}", content=f"KeyError: 'item{i}' in handler")
            )
        else:
            items.append(
                MessageInput(role="user", content=f"Message {i} about the weather and lunch plans. " * 3)
            )
    messages_append(tenant=tenant, session=session, items=items)
    timings = []
    result = None
    for _ in range(5):
        start = time.perf_counter()
        result = compression.session_compress(tenant=tenant, session=session, target_ratio=0.3)
        timings.append(time.perf_counter() - start)
    assert result is not None
    decisions = sum(1 for item in result.kept if item.category == "decision")
    print(
        f"4. compress 1,000 messages ({result.tokens_before:,} tokens) to 0.3: {median_ms(timings):.0f} ms, "
        f"ratio reached {result.ratio:.3f}, {decisions}/40 decisions kept whole, "
        f"{len(result.dropped)} dropped"
    )


def main() -> None:
    setup_test_environment()
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        from memory.models import Tenant
        from memory.services.embedding import embedder_get

        embedder_get().embed(["warm up"])  # model load is a one-off per process, not per append
        tenant = Tenant.objects.create(name="bench", slug="bench")
        bench_append(tenant)
        bench_detection(tenant)
        bench_report(tenant)
        bench_compression(tenant)
    finally:
        teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
