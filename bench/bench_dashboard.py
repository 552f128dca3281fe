"""Dashboard pages: render time and queries, a 200-message session vs a 100,000-message one.

    python bench/bench_dashboard.py [--messages 100000] [--repeat 15]

In-process (Django test client, real PostgreSQL from the test settings): the median time and the
query count of each page for a tenant whose session holds 200 messages and for one whose session
holds `--messages` messages (each with 40 context builds), plus the cost of one live re-render
of every session panel (what the websocket consumer does at most once per flush interval).
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
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402


def timed(client: Client, url: str, repeat: int) -> tuple[float, int]:
    times = []
    queries = 0
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
        queries = len(captured.captured_queries)
    return statistics.median(times), queries


def build(messages: int) -> tuple[Client, Client, str, str]:
    """Tenant `small` (a 200-message session) and tenant `full` (a `messages`-message session)."""
    from django.contrib.auth import get_user_model

    from memory.models import Membership, Message, Session, Tenant
    from memory.services import context, sessions

    empty = Tenant.objects.create(name="Small", slug="small")
    full = Tenant.objects.create(name="Full", slug="full")
    user_model = get_user_model()
    clients = []
    for tenant in (empty, full):
        user = user_model.objects.create_user(username=f"u-{tenant.slug}", password="x")
        Membership.objects.create(user=user, tenant=tenant)
        client = Client()
        client.force_login(user)
        clients.append(client)
    session = sessions.session_create(tenant=full, agent_external_id="bench-bot")
    now = timezone.now()
    for start in range(1, messages + 1, 10_000):
        Message.objects.bulk_create(
            [
                Message(
                    tenant=full,
                    session=session,
                    seq=seq,
                    role="user" if seq % 2 else "assistant",
                    content=f"message {seq}: pool at 20 of 20",
                    token_count=12,
                    created_at=now,
                )
                for seq in range(start, min(start + 10_000, messages + 1))
            ]
        )
    Session.objects.filter(pk=session.pk).update(message_seq=messages, message_count=messages)
    session.refresh_from_db()
    small = sessions.session_create(tenant=empty, agent_external_id="bench-bot")
    Message.objects.bulk_create(
        [
            Message(
                tenant=empty,
                session=small,
                seq=seq,
                role="user",
                content=f"message {seq}: pool",
                token_count=12,
                created_at=now,
            )
            for seq in range(1, 201)
        ]
    )
    Session.objects.filter(pk=small.pk).update(message_seq=200, message_count=200)
    for _ in range(40):
        context.context_build(tenant=empty, session=small, next_input="next?")
    for _ in range(40):
        context.context_build(tenant=full, session=session, next_input="next?")
    with connection.cursor() as cursor:  # what autovacuum would have done after a bulk load
        cursor.execute("ANALYZE")
    return clients[0], clients[1], small.public_id, session.public_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    from django.conf import settings

    settings.DATABASES["default"]["TEST"]["MIGRATE"] = False  # tables from the models, as in the tests
    old = setup_databases(verbosity=0, interactive=False)
    try:
        started = time.perf_counter()
        empty_client, full_client, empty_sid, full_sid = build(args.messages)
        print(
            f"setup: {args.messages:,} messages + 40 context builds in {time.perf_counter() - started:.1f} s"
        )
        pages = [
            ("overview", "/"),
            ("session", "/sessions/{sid}/"),
            ("older page (middle)", "/sessions/{sid}/messages?before={mid}"),
            ("agent", "/agents/bench-bot/"),
            ("experiences", "/experiences/"),
            ("jobs", "/jobs/"),
        ]
        print(f"{'page':<22}{'200 msgs ms':>12}{'q':>5}{'100k msgs ms':>14}{'q':>5}{'ratio':>8}")
        for name, pattern in pages:
            e_ms, e_q = timed(empty_client, pattern.format(sid=empty_sid, mid=100), args.repeat)
            f_ms, f_q = timed(full_client, pattern.format(sid=full_sid, mid=args.messages // 2), args.repeat)
            print(f"{name:<22}{e_ms:>12.1f}{e_q:>5}{f_ms:>14.1f}{f_q:>5}{f_ms / e_ms:>8.2f}")

        from dashboard import panels
        from memory.models import Session

        session = Session.objects.select_related("agent", "tenant").get(public_id=full_sid)
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            for name in panels.PAGE_PANELS["session"]:
                panels.panel_render(name, tenant=session.tenant, session=session)
            times.append((time.perf_counter() - started) * 1000)
        print(
            f"live re-render of all {len(panels.PAGE_PANELS['session'])} session panels: "
            f"median {statistics.median(times):.1f} ms"
        )
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
