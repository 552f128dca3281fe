"""Retention moves the clock: sessions expire and get evicted, tasks and events are purged."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from memory.models import (
    Event,
    IdempotencyRecord,
    Message,
    Session,
    SessionRetentionPolicy,
    SessionStatus,
    StoreItem,
    Task,
)
from memory.services import retention
from memory.services.sessions import (
    MessageInput,
    messages_append,
    session_access,
    session_create,
    task_create,
)
from memory.tasks.sessions import SCHEDULE, sessions_retention_run

pytestmark = pytest.mark.django_db


def evictions(tenant, kind):  # type: ignore[no-untyped-def]
    return [
        e.payload
        for e in Event.objects.filter(tenant=tenant, type="retention.evicted").order_by("created_at", "seq")
        if e.payload["kind"] == kind
    ]


def test_idle_sessions_expire_after_the_ttl_and_active_ones_do_not(tenant_a):
    start = timezone.now() - timedelta(hours=12)
    idle = session_create(tenant=tenant_a, agent_external_id="bot", now=start)
    busy = session_create(tenant=tenant_a, agent_external_id="bot", now=start)
    messages_append(tenant=tenant_a, session=busy, items=[MessageInput(role="user", content="still here")])

    assert retention.sessions_expire_idle(tenant=tenant_a, now=start + timedelta(hours=23)) == 0
    # A day after `start`: the idle one is past its TTL, the busy one was used 12 hours ago.
    report = retention.retention_run(now=start + timedelta(hours=24, minutes=1))
    assert report.sessions_expired == 1

    idle.refresh_from_db()
    busy.refresh_from_db()
    assert idle.status == SessionStatus.EXPIRED and idle.ended_at is not None
    assert busy.status == SessionStatus.OPEN
    [payload] = evictions(tenant_a, "session")
    assert (
        payload["id"] == idle.public_id and payload["reason"] == "idle_ttl" and payload["status"] == "expired"
    )
    assert payload["gen_ai.agent.id"] == "bot"
    assert Message.objects.filter(session=busy).count() == 1
    assert retention.sessions_expire_idle(tenant=tenant_a, now=start + timedelta(hours=25)) == 0  # idempotent


def test_the_policy_ttl_and_a_reads_touch_decide_expiry(tenant_a, django_capture_on_commit_callbacks):
    policy = SessionRetentionPolicy.for_tenant(tenant_a)
    policy.session_idle_ttl_hours = 1
    policy.save()
    start = timezone.now() - timedelta(hours=3)
    session = session_create(tenant=tenant_a, agent_external_id="bot", now=start)
    assert session.idle_ttl_seconds == 3600
    with django_capture_on_commit_callbacks(execute=True):
        session_access(tenant=tenant_a, session_id=session.public_id)  # an agent read keeps it alive
    assert retention.sessions_expire_idle(tenant=tenant_a, now=timezone.now() + timedelta(minutes=59)) == 0
    assert retention.sessions_expire_idle(tenant=tenant_a, now=timezone.now() + timedelta(minutes=61)) == 1


def test_an_expired_session_refuses_appends(tenant_a):
    from memory.exceptions import SessionEnded

    start = timezone.now() - timedelta(days=2)
    session = session_create(tenant=tenant_a, agent_external_id="bot", now=start)
    retention.retention_run()
    session.refresh_from_db()
    with pytest.raises(SessionEnded):
        messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="x")])


def test_creating_more_live_sessions_than_allowed_evicts_the_least_recently_accessed(tenant_a, tenant_b):
    policy = SessionRetentionPolicy.for_tenant(tenant_a)
    policy.max_live_sessions_per_agent = 3
    policy.save()
    base = timezone.now() - timedelta(hours=1)
    sessions = [
        session_create(tenant=tenant_a, agent_external_id="bot", now=base + timedelta(minutes=i))
        for i in range(3)
    ]
    # The oldest one is used again, so the second-oldest is now the least recently accessed.
    messages_append(tenant=tenant_a, session=sessions[0], items=[MessageInput(role="user", content="x")])
    newest = session_create(tenant=tenant_a, agent_external_id="bot")
    other_agent = session_create(tenant=tenant_a, agent_external_id="other-bot")
    bobs = [session_create(tenant=tenant_b, agent_external_id="bot") for _ in range(4)]

    statuses = {s.public_id: s.status for s in Session.objects.filter(tenant=tenant_a)}
    assert statuses[sessions[1].public_id] == SessionStatus.EVICTED
    assert [statuses[s.public_id] for s in (sessions[0], sessions[2], newest, other_agent)] == ["open"] * 4
    [payload] = evictions(tenant_a, "session")
    assert payload["id"] == sessions[1].public_id and payload["reason"] == "live_limit"
    assert all(
        s.status == SessionStatus.OPEN for s in Session.objects.filter(tenant=tenant_b)
    )  # Bob: default 100
    assert len(bobs) == 4


def test_lowering_the_limit_evicts_on_the_next_run(tenant_a):
    base = timezone.now() - timedelta(hours=1)
    sessions = [
        session_create(tenant=tenant_a, agent_external_id="bot", now=base + timedelta(minutes=i))
        for i in range(5)
    ]
    policy = SessionRetentionPolicy.for_tenant(tenant_a)
    policy.max_live_sessions_per_agent = 2
    policy.save()
    report = retention.retention_run(now=base + timedelta(minutes=10))
    assert report.sessions_evicted == 3
    live = set(Session.objects.filter(status=SessionStatus.OPEN).values_list("public_id", flat=True))
    assert live == {sessions[3].public_id, sessions[4].public_id}
    assert len(evictions(tenant_a, "session")) == 3


def test_tasks_older_than_seven_days_are_purged_and_leave_an_event(tenant_a):
    now = timezone.now()
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    old = task_create(tenant=tenant_a, session=session, input="old", now=now - timedelta(days=8))
    recent = task_create(tenant=tenant_a, session=session, input="recent", now=now - timedelta(days=6))
    assert retention.tasks_purge(tenant=tenant_a, now=now) == 1
    assert list(Task.objects.values_list("public_id", flat=True)) == [recent.public_id]
    [payload] = evictions(tenant_a, "task")
    assert payload["id"] == old.public_id and payload["reason"] == "age"
    assert Event.objects.filter(tenant=tenant_a, type="task.created").count() == 2  # the audit trail stays


def test_at_most_max_tasks_per_tenant_are_kept(tenant_a, tenant_b):
    policy = SessionRetentionPolicy.for_tenant(tenant_a)
    policy.max_tasks = 3
    policy.save()
    now = timezone.now()
    tasks = [
        task_create(tenant=tenant_a, input=str(i), now=now - timedelta(minutes=10 - i)) for i in range(5)
    ]
    bob = [task_create(tenant=tenant_b, input="b") for _ in range(5)]
    report = retention.retention_run(now=now)
    assert report.tasks_purged == 2
    kept = set(Task.objects.filter(tenant=tenant_a).values_list("public_id", flat=True))
    assert kept == {t.public_id for t in tasks[2:]}
    assert {p["id"] for p in evictions(tenant_a, "task")} == {tasks[0].public_id, tasks[1].public_id}
    assert Task.objects.filter(tenant=tenant_b).count() == len(bob)


def test_events_older_than_the_policy_are_deleted_once_summarised(tenant_a, tenant_b):
    now = timezone.now()
    session_create(tenant=tenant_a, agent_external_id="bot")
    session_create(tenant=tenant_b, agent_external_id="bot")
    Event.objects.update(created_at=now - timedelta(days=91))
    recent = session_create(tenant=tenant_a, agent_external_id="bot")
    policy = SessionRetentionPolicy.for_tenant(tenant_b)
    policy.event_retention_days = 0  # Bob keeps his forever
    policy.save()

    report = retention.retention_run(now=now)
    assert report.events_purged == 1
    types = list(Event.objects.filter(tenant=tenant_a).order_by("created_at").values_list("type", flat=True))
    assert types == ["session.created", "retention.evicted"]
    assert Event.objects.get(tenant=tenant_a, type="session.created").session == recent
    [payload] = evictions(tenant_a, "events")
    assert payload["count"] == 1
    assert Event.objects.filter(tenant=tenant_b).count() == 1


def test_idempotency_records_past_their_ttl_are_purged(tenant_a):
    now = timezone.now()
    IdempotencyRecord.objects.create(
        tenant=tenant_a, key="old", request_hash="x", created_at=now - timedelta(hours=25)
    )
    IdempotencyRecord.objects.create(
        tenant=tenant_a, key="new", request_hash="x", created_at=now - timedelta(hours=1)
    )
    assert retention.retention_run(now=now).idempotency_purged == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["new"]


def test_store_items_past_their_ttl_are_purged_even_when_their_owner_stopped_writing(tenant_a, tenant_b):
    now = timezone.now()
    for tenant, key, expires in [
        (tenant_a, "gone", now - timedelta(minutes=1)),
        (tenant_b, "gone-too", now - timedelta(days=3)),
        (tenant_a, "kept", now + timedelta(minutes=5)),
        (tenant_a, "forever", None),
    ]:
        StoreItem.objects.create(
            tenant=tenant, owner="", namespace_path="users/1", key=key, value={}, expires_at=expires
        )
    assert retention.retention_run(now=now).store_items_purged == 2
    assert sorted(StoreItem.objects.values_list("key", flat=True)) == ["forever", "kept"]
    assert retention.retention_run(now=now).store_items_purged == 0


def test_the_beat_task_runs_the_retention_and_is_scheduled(tenant_a):
    session_create(tenant=tenant_a, agent_external_id="bot", now=timezone.now() - timedelta(days=2))
    result = sessions_retention_run.apply().get()
    assert result["sessions_expired"] == 1
    assert Session.objects.get().status == SessionStatus.EXPIRED
    assert SCHEDULE["sessions-retention"]["task"] == sessions_retention_run.name
    from memory.tasks import BEAT_SCHEDULE

    assert "sessions-retention" in BEAT_SCHEDULE


@pytest.mark.django_db(transaction=True)
def test_the_retention_job_runs_on_a_real_worker(tenant_a, celery_worker):
    """`celery -A ctxapp worker` finds the app (loaded lazily) and this module's task."""
    import time

    session = session_create(tenant=tenant_a, agent_external_id="bot", now=timezone.now() - timedelta(days=2))
    sessions_retention_run.delay()
    # Generous: under load the worker may take long to boot (it imports every capability's tasks).
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        session.refresh_from_db()
        if session.status != SessionStatus.OPEN:
            break
        time.sleep(0.2)
    assert session.status == SessionStatus.EXPIRED
    assert evictions(tenant_a, "session")[0]["id"] == session.public_id
