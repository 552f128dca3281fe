"""The user profile's cost: a context build with the `user_profile` component off and on, for a
user with 50 and 500 current memories (embedded), and the dashboard's user page for a user whose
500 subjects have 4 versions each.

    python bench/bench_user_profile.py [--repeat 15]

In-process (real PostgreSQL from the test settings, the real token counter and embedder). Builds
with the component off and on run interleaved, so the ratio is measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings_test")

import django

django.setup()

import numpy as np  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

TYPES = ("constraint", "preference", "profile", "decision", "plan", "fact")


def _user(tenant, user_id: str, subjects: int, versions: int) -> None:  # type: ignore[no-untyped-def]
    from memory.models import UserMemory
    from memory.services.user_memory.store import memory_record

    start = timezone.now() - timedelta(days=versions + 1)
    for n in range(subjects):
        for v in range(versions):
            memory_record(
                tenant=tenant,
                user_id=user_id,
                subject=f"topic.{n}",
                text=f"The user said thing {n} (version {v}) about hobby {n % 17} and city {n % 5}.",
                memory_type=TYPES[n % len(TYPES)],
                confidence=0.5 + (n % 5) / 10,
                agent="bench-bot",
                at=start + timedelta(days=v, seconds=n),
            )
    rng = np.random.default_rng(7)
    for memory in UserMemory.objects.filter(tenant=tenant, user_id=user_id, valid_to__isnull=True):
        vector = rng.standard_normal(384).astype(np.float32)
        memory.embedding = vector / np.linalg.norm(vector)
        memory.save(update_fields=["embedding"])


def _builds(tenant, session, repeat: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    from memory.services.context import context_build

    question = "Which hobby should I pick up in my city this spring?"
    context_build(tenant=tenant, session=session, next_input=question)  # warm the embedder and caches
    off, on = [], []
    tokens = 0
    for _ in range(repeat):
        for share, into in ((0.0, off), (0.1, on)):
            started = time.perf_counter()
            built = context_build(
                tenant=tenant, session=session, next_input=question, overrides={"user_profile_share": share}
            )
            into.append((time.perf_counter() - started) * 1000)
            if share:
                tokens = built.budget["components"]["user_profile"]
    return statistics.median(off), statistics.median(on), tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    from django.conf import settings

    settings.DATABASES["default"]["TEST"]["MIGRATE"] = False  # tables from the models, as in the tests
    old = setup_databases(verbosity=0, interactive=False)
    try:
        from django.contrib.auth import get_user_model

        from memory.models import Membership, MembershipRole, Tenant
        from memory.services import sessions

        tenant = Tenant.objects.create(name="Bench", slug="bench")
        print(f"{'current memories':<18}{'off ms':>9}{'on ms':>9}{'ratio':>8}{'block tokens':>14}")
        for count in (50, 500):
            user_id = f"user-{count}"
            _user(tenant, user_id, subjects=count, versions=1)
            session = sessions.session_create(
                tenant=tenant, agent_external_id="bench-bot", user_id=user_id, model_name="gpt-4o"
            )
            off, on, tokens = _builds(tenant, session, args.repeat)
            print(f"{count:<18}{off:>9.1f}{on:>9.1f}{on / off:>8.2f}{tokens:>14}")

        _user(tenant, "history", subjects=500, versions=4)
        user = get_user_model().objects.create_user(username="bench", password="x")
        Membership.objects.create(user=user, tenant=tenant, role=MembershipRole.ADMIN)
        client = Client()
        client.force_login(user)
        times, queries = [], 0
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                response = client.get("/users/history/")
                times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200
            queries = len(captured.captured_queries)
        median = statistics.median(times)
        print(f"user page, 500 subjects x 4 versions: median {median:.1f} ms, {queries} queries")
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
