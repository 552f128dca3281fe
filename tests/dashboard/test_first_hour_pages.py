"""What a first look at the dashboard and the admin must show honestly: the job queue while the broker
cannot count it, a budget chart after one build, a summary as headings and bullets, the way to the
admin for staff, and the admin's own words for API keys."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client

from dashboard import charts, jobs
from memory.models import JobIntent, JobStatus, Tenant
from memory.services import context, rolling_summary
from memory.services import sessions as sessions_service
from tests.dashboard.conftest import logged_in, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def broken_queue() -> Any:
    """The broker answers, but the default queue's key holds a string: it cannot count the queue."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    saved = client.dump(queue)
    client.set(queue, "not a list")
    jobs._depth_cache = None
    yield
    client.delete(queue)
    if saved is not None:
        client.restore(queue, 0, saved)
    jobs._depth_cache = None


def test_the_job_queue_is_not_zero_while_the_broker_cannot_count_it(
    web_alice: Client, tenant_a: Tenant, broken_queue: None
) -> None:
    JobIntent.objects.create(tenant=tenant_a, kind="digest", key="d-1", payload={}, status=JobStatus.PENDING)
    page = web_alice.get("/").content.decode()
    card = re.search(r'data-testid="stat-job-queue">(.*?)</div>', page, re.S)
    assert card, page
    assert "waiting" not in card[1] and ">0<" not in card[1], card[1]
    assert "?" in card[1] and "1 job wait in the outbox" in card[1], card[1]


def test_a_budget_chart_with_one_build_shows_it_mid_chart_with_its_value() -> None:
    at = datetime(2026, 1, 2, 9, 30, tzinfo=UTC)
    svg = charts.line_chart(points=[(at, 1234.0)], limit=8000, width=420)
    dot = re.search(r'class="series-dot" cx="([\d.]+)"', svg)
    assert dot and 200 < float(dot[1]) < 240, svg  # the middle of the plot (40..412), not the axis
    assert ">1.2k<" in svg and ">09:30:00<" in svg, svg


def test_a_session_page_with_one_build_draws_it(web_alice: Client, tenant_a: Tenant, session_a: Any) -> None:
    context.context_build(tenant=tenant_a, session=session_a, next_input="what next?")
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    dot = re.search(r'class="series-dot" cx="([\d.]+)"', page)
    assert dot and float(dot[1]) > 100, page


def test_a_summary_reads_as_headings_and_bullets(web_alice: Client, tenant_a: Tenant, session_a: Any) -> None:
    turns = [
        "We decided to roll back the checkout deploy.",
        "The pool size must stay at 40 connections.",
        "Why did web-3 run out of connections first?",
        "Next we will add an alert on pool saturation.",
    ] * 4
    sessions_service.messages_append(
        tenant=tenant_a,
        session=session_a,
        items=[
            sessions_service.MessageInput(role="user", content=f"{t} (turn {i})") for i, t in enumerate(turns)
        ],
    )
    summary = rolling_summary.session_summarise(tenant=tenant_a, session=session_a)
    assert summary is not None
    bullets = [line for line in summary.text.splitlines() if line.startswith("- ")]
    headings = [line[:-1] for line in summary.text.splitlines() if line.endswith(":")]
    assert len(bullets) >= 2 and headings, summary.text
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    block = re.search(r'data-testid="summary-text">(.*?)</div>', page, re.S)
    assert block, page
    assert block[1].count("<li>") == len(bullets), block[1]
    assert all(f"<h4>{heading}</h4>" in block[1] for heading in headings), block[1]


def test_staff_see_a_link_to_the_admin_others_do_not(web_alice: Client, tenant_a: Tenant) -> None:
    assert 'data-testid="admin-link"' not in web_alice.get("/").content.decode()
    carol = make_user("carol-staff", staff=True)
    from memory.models import Membership, MembershipRole

    Membership.objects.create(user=carol, tenant=tenant_a, role=MembershipRole.ADMIN)
    page = logged_in(carol).get("/").content.decode()
    assert 'data-testid="admin-link"' in page and 'href="/admin/"' in page


def test_the_admin_labels_api_keys_so(admin_client: Any) -> None:
    index = admin_client.get("/admin/").content.decode()
    assert ">API keys<" in index and "Api keys" not in index
    listing = admin_client.get("/admin/memory/apikey/").content.decode()
    assert "Select API key to change" in listing
