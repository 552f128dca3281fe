"""Dashboard pages through Django's test client: access, tenant scoping, empty and huge tenants."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from memory.models import Event, Membership, Message, Session, Tenant
from memory.services import sessions as sessions_service
from tests.dashboard.conftest import PASSWORD, logged_in

PAGES = ["/", "/sessions/", "/agents/", "/experiences/", "/jobs/", "/jobs/running", "/experiences/?q=timeout"]


def test_it_requires_login(client: Client, session_a: Any) -> None:
    for url in [*PAGES, f"/sessions/{session_a.public_id}/", "/agents/triage-bot/"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/login/?next="), url


def test_it_logs_in_and_out(client: Client, alice: Any) -> None:
    response = client.post("/login/", {"username": "alice", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"] == "/"
    assert "Alice&#x27;s team" in client.get("/").content.decode()
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_a_wrong_password_is_refused(client: Client, alice: Any) -> None:
    response = client.post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "did not match" in response.content.decode()
    assert "_auth_user_id" not in client.session


@pytest.mark.django_db
def test_every_page_renders_for_a_tenant_with_no_data(web_alice: Client) -> None:
    for url in PAGES:
        response = web_alice.get(url)
        assert response.status_code == 200, url
    overview = web_alice.get("/").content.decode()
    assert (
        "No agents yet" in overview
        and "No open sessions" in overview
        and "No events recorded yet" in overview
    )
    assert "No sessions yet" in web_alice.get("/sessions/").content.decode()


def test_session_and_agent_pages_show_their_data(web_alice: Client, session_a: Any) -> None:
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert "The checkout page returns 502 since 09:14." in page
    assert 'id="msg-2"' in page and 'id="msg-1"' in page
    assert (
        "→ metrics.query({&quot;expr&quot;: &quot;db_pool_in_use&quot;})" in page and "legacy.shape" in page
    )
    assert 'ws-connect="/ws/dashboard/?tenant=alice&amp;page=session&amp;session=' in page
    agent = web_alice.get("/agents/triage-bot/").content.decode()
    assert "message.added" in agent and "session.created" in agent
    filtered = web_alice.get("/agents/triage-bot/?type=session.created").content.decode()
    log = filtered.split('id="panel-agent-events"')[1]
    assert "session.created" in log and "message.added</span>" not in log
    assert "events=off" in filtered  # a filtered log is not replaced by live updates


def test_bob_cannot_see_alices_session_or_agent(web_bob: Client, session_a: Any) -> None:
    """Bob should have no access to Alice's stuff: her ids answer 404 like missing ones."""
    for url in [
        f"/sessions/{session_a.public_id}/",
        f"/sessions/{session_a.public_id}/messages?before=2",
        "/agents/triage-bot/",
        "/agents/triage-bot/events?before=5",
        "/sessions/sess_000000000000000000000000/",
    ]:
        assert web_bob.get(url).status_code == 404, url
    assert "triage-bot" not in web_bob.get("/").content.decode()
    assert "triage-bot" not in web_bob.get("/sessions/").content.decode()


def test_bob_cannot_switch_to_alices_tenant(web_bob: Client, tenant_a: Tenant, tenant_b: Tenant) -> None:
    assert web_bob.post("/tenant/switch", {"tenant": tenant_a.slug}).status_code == 404
    page = web_bob.get("/").content.decode()
    assert "Bob&#x27;s team" in page and "Alice&#x27;s team" not in page


def test_a_user_without_membership_sees_the_no_tenant_page(db: None, tenant_a: Tenant) -> None:
    from tests.dashboard.conftest import make_user

    response = logged_in(make_user("dave")).get("/")
    assert response.status_code == 403
    assert "not a member of any tenant" in response.content.decode()


def test_staff_see_every_tenant_and_can_switch(
    carol: Any, tenant_a: Tenant, tenant_b: Tenant, session_a: Any
) -> None:
    web = logged_in(carol)
    page = web.get("/").content.decode()
    assert "Alice&#x27;s team" in page and "Bob&#x27;s team" in page
    assert web.post("/tenant/switch", {"tenant": "bob"}).status_code == 302
    assert web.get(f"/sessions/{session_a.public_id}/").status_code == 404  # scoped to Bob now
    web.post("/tenant/switch", {"tenant": "alice"})
    assert web.get(f"/sessions/{session_a.public_id}/").status_code == 200


def test_a_member_of_two_tenants_switches_between_them(
    alice: Any, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    Membership.objects.create(user=alice, tenant=tenant_b)
    session_b = sessions_service.session_create(tenant=tenant_b, agent_external_id="bobs-bot")
    web = logged_in(alice)
    assert web.get(f"/sessions/{session_b.public_id}/").status_code == 404  # Alice's team selected first
    web.post("/tenant/switch", {"tenant": "bob"})
    assert web.get(f"/sessions/{session_b.public_id}/").status_code == 200
    assert "bobs-bot" in web.get("/").content.decode()


def test_retrying_a_job_needs_a_retry_service_and_the_right_tenant(
    web_alice: Client, web_bob: Client, tenant_a: Tenant
) -> None:
    from django.db import transaction

    from memory.services import recorder

    with transaction.atomic():
        event = recorder.event_append(tenant=tenant_a, type="backfill.failed", payload={"error": "boom"})
    jobs_page = web_alice.get("/jobs/").content.decode()
    assert "backfill.failed" in jobs_page and "no retry" in jobs_page
    assert web_alice.post(f"/jobs/{event.public_id}/retry").status_code == 409
    assert web_bob.post(f"/jobs/{event.public_id}/retry").status_code in (403, 404)
    assert Event.objects.filter(tenant=tenant_a).count() == 1  # nothing was retried or recorded


def huge_session(tenant: Tenant, count: int = 100_000) -> Session:
    session = sessions_service.session_create(tenant=tenant, agent_external_id="chatty-bot")
    now = timezone.now()
    batch = 10_000
    for start in range(1, count + 1, batch):
        Message.objects.bulk_create(
            [
                Message(
                    tenant=tenant,
                    session=session,
                    seq=seq,
                    role="user" if seq % 2 else "assistant",
                    content=f"message number {seq}",
                    token_count=4,
                    created_at=now,
                )
                for seq in range(start, min(start + batch, count + 1))
            ]
        )
    Session.objects.filter(pk=session.pk).update(
        message_seq=count, message_count=count, token_count=4 * count
    )
    session.refresh_from_db()
    return session


def test_every_page_stays_paginated_and_bounded_with_a_100k_message_session(
    web_alice: Client, tenant_a: Tenant, django_assert_max_num_queries: Any
) -> None:
    session = huge_session(tenant_a)
    with django_assert_max_num_queries(30):
        page = web_alice.get(f"/sessions/{session.public_id}/").content.decode()
    assert 'id="msg-100000"' in page and 'id="msg-99951"' in page and 'id="msg-99950"' not in page
    assert "before=99951" in page  # older on demand
    with django_assert_max_num_queries(15):
        older = web_alice.get(f"/sessions/{session.public_id}/messages?before=99951").content.decode()
    assert 'id="msg-99950"' in older and 'id="msg-99901"' in older and 'id="msg-99900"' not in older
    deep = web_alice.get(f"/sessions/{session.public_id}/messages?before=3").content.decode()
    assert 'id="msg-2"' in deep and 'id="msg-1"' in deep and "Load older" not in deep
    for url in PAGES:
        with django_assert_max_num_queries(30):
            assert web_alice.get(url).status_code == 200, url
    # The recovered-state preview runs each recovery part in its own savepoint with a timeout.
    with django_assert_max_num_queries(70):
        assert web_alice.get("/agents/chatty-bot/").status_code == 200


def test_session_page_shows_budget_manifest_and_facts_after_a_build(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    from memory.services import context, decay

    decay.fact_register(
        tenant=tenant_a,
        session=session_a,
        key="deploy_window",
        fact_type="constraint",
        content="Never restart db-1 during business hours",
    )
    empty = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert 'data-testid="budget-empty"' in empty and 'data-testid="manifest-empty"' in empty
    context.context_build(tenant=tenant_a, session=session_a, next_input="What should we check next?")
    context.context_build(tenant=tenant_a, session=session_a, next_input="And after that?")
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert 'data-testid="budget-gauge"' in page and "85 %" in page
    assert 'class="chart stacked"' in page and 'class="chart line"' in page
    assert 'data-testid="manifest"' in page and "history" in page
    assert "deploy_window" in page and "Never restart db-1" in page
    assert 'data-testid="forecast"' in page


def test_agent_page_shows_checkpoints_state_diff_and_recovered_state(
    web_alice: Client, web_bob: Client, tenant_a: Tenant, session_a: Any
) -> None:
    from memory.services import cognition

    agent = session_a.agent
    cognition.checkpoint_create(
        tenant=tenant_a,
        agent=agent,
        reason="triage started",
        state={"context": {"goal": "fix 502s", "constraints": []}, "decision": "check pool"},
    )
    cognition.checkpoint_create(
        tenant=tenant_a,
        agent=agent,
        reason="pool resized",
        state={
            "context": {"goal": "fix 502s", "constraints": ["no restarts"]},
            "decision": "resize pool to 50",
        },
    )
    events_before = Event.objects.filter(tenant=tenant_a).count()
    page = web_alice.get("/agents/triage-bot/").content.decode()
    assert "triage started" in page and "pool resized" in page
    assert "resize pool to 50" in page  # cognitive state
    assert 'data-testid="recovered-state"' in page and "fix 502s" in page
    assert Event.objects.filter(tenant=tenant_a).count() == events_before  # the preview recorded nothing

    state = web_alice.get("/agents/triage-bot/checkpoints/1").content.decode()
    assert 'data-testid="checkpoint-state"' in state and "check pool" in state
    diff = web_alice.get("/agents/triage-bot/diff?a=1&b=2").content.decode()
    assert 'data-testid="checkpoint-diff"' in diff
    assert (
        "/decision" in diff
        and "diff-changed" in diff
        and "/context/constraints/0" in diff
        and "diff-added" in diff
    )
    assert web_alice.get("/agents/triage-bot/checkpoints/99").status_code == 404
    assert web_bob.get("/agents/triage-bot/checkpoints/1").status_code == 404
    assert web_bob.get("/agents/triage-bot/diff?a=1&b=2").status_code == 404


def test_experiences_page_lists_and_searches_with_signal_contributions(
    web_alice: Client, web_bob: Client, tenant_a: Tenant
) -> None:
    from memory.services import experiences

    experiences.experience_create(
        tenant=tenant_a,
        problem="Checkout returns 502 after deploy",
        cause="Upstream connection pool exhausted",
        solution="Raise pool size to 50",
        confidence=0.8,
    )
    page = web_alice.get("/experiences/").content.decode()
    assert "Checkout returns 502 after deploy" in page and "emb-" in page
    results = web_alice.get("/experiences/?q=connection+pool+exhausted").content.decode()
    assert 'data-testid="search-results"' in results and "Raise pool size to 50" in results
    # each signal's contribution is shown
    assert "adds: vector" in results and "· text " in results and "raw: cosine" in results
    assert (
        "Checkout returns 502"
        not in web_bob.get("/experiences/?q=connection+pool+exhausted").content.decode()
    )


def test_session_page_marks_summaries_on_the_budget_chart(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    from memory.services import context, rolling_summary

    window = {"max_input_tokens": 600, "output_reserve": 64, "keep_verbatim": 2}
    for turn in range(12):
        sessions_service.messages_append(
            tenant=tenant_a,
            session=session_a,
            items=[
                sessions_service.MessageInput(
                    role="user", content=f"Turn {turn}: the pool on web-3 is still at 20 of 20."
                ),
                sessions_service.MessageInput(
                    role="assistant", content=f"Turn {turn}: checking the canary deploy log."
                ),
            ],
        )
        context.context_build(tenant=tenant_a, session=session_a, next_input="next?", overrides=window)
    summary = rolling_summary.session_summarise(tenant=tenant_a, session=session_a)
    assert summary is not None
    context.context_build(tenant=tenant_a, session=session_a, next_input="next?", overrides=window)
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert f"up to #{summary.covers_up_to_seq}" in page and "current" in page
    assert 'class="marker-line"' in page  # the summarisation is marked on the line chart


def test_an_operator_retries_a_failed_embedding_job(
    web_alice: Client, alice: Any, tenant_a: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    from memory.models import Experience
    from memory.services import experiences

    experiences.experience_create(tenant=tenant_a, problem="Disk full on db-2", solution="rotate WAL")
    experience = Experience.objects.get(tenant=tenant_a)
    experiences.experiences_mark_failed(experience_ids=[experience.pk], reason="embedder unreachable")
    failure = Event.objects.get(tenant=tenant_a, type="experience.embedding_failed")
    page = web_alice.get("/jobs/").content.decode()
    assert f"/jobs/{failure.public_id}/retry" in page and "embedder unreachable" in page

    viewer = logged_in(make_viewer(tenant_a))
    assert viewer.post(f"/jobs/{failure.public_id}/retry").status_code == 403
    experience.refresh_from_db()
    assert experience.embedding_status == "failed"

    with django_capture_on_commit_callbacks(execute=False):
        response = web_alice.post(f"/jobs/{failure.public_id}/retry")
    assert response.status_code == 200 and "queued again" in response.content.decode()
    experience.refresh_from_db()
    assert experience.embedding_status == "pending"
    assert Event.objects.filter(tenant=tenant_a, type="experience.embedding_retried").count() == 1
    again = web_alice.post(f"/jobs/{failure.public_id}/retry")  # idempotent: nothing left to retry
    assert again.status_code == 200 and "no longer failed" in again.content.decode()
    assert Event.objects.filter(tenant=tenant_a, type="experience.embedding_retried").count() == 1


def test_the_jobs_page_shows_a_reembed_in_progress(
    web_alice: Client, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    from memory.services import experiences

    experiences.experience_create(tenant=tenant_a, problem="Disk full on db-2", solution="rotate WAL")
    experiences.experience_create(tenant=tenant_b, problem="Bob's secret outage", solution="none")
    page = web_alice.get("/jobs/").content.decode()
    assert "reembed-" not in page and "No long job reported progress" in page

    result = experiences.experiences_reembed(tenant=tenant_a)

    page = web_alice.get("/jobs/").content.decode()
    assert result.job in page and '<progress max="100" value="100">' in page and "1 / 1" in page


def make_viewer(tenant: Tenant) -> Any:
    from tests.dashboard.conftest import make_user

    user = make_user("victor")
    Membership.objects.create(user=user, tenant=tenant, role="viewer")
    return user


def test_the_forecast_reads_like_a_sentence() -> None:
    from dashboard.capabilities import _forecast_text

    assert _forecast_text({}) == ""
    assert _forecast_text({"turns_until_summarisation": 0, "growth_tokens_per_turn": 50}) == (
        "At or above the summarisation threshold now."
    )
    assert _forecast_text(
        {
            "turns_until_summarisation": 4,
            "turns_until_window": 9,
            "growth_tokens_per_turn": 75,
            "basis": "builds",
        }
    ) == (
        "About 4 turns until the summarisation threshold, 9 until the budget is full "
        "(≈75 tokens per turn over recent builds)."
    )
    shrinking = {"turns_until_summarisation": None, "growth_tokens_per_turn": -10.0, "basis": "builds"}
    assert _forecast_text(shrinking) == "Shrinking over recent builds: no threshold in sight."
    flat = {"turns_until_summarisation": None, "growth_tokens_per_turn": 0, "basis": "window"}
    assert _forecast_text(flat) == "Not growing over the current window: no threshold in sight."


def test_favicon_is_served(client) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers import body_of

    response = client.get("/favicon.ico", follow=True)
    assert response.status_code == 200
    assert b"<svg" in body_of(response)


def test_viewing_a_session_does_not_keep_it_alive_but_an_agent_read_does(
    web_alice: Client, session_a: Any, tenant_a: Tenant, api_a: Any, django_capture_on_commit_callbacks: Any
) -> None:
    past = timezone.now() - timedelta(hours=1)
    Session.objects.filter(pk=session_a.pk).update(
        last_accessed_at=past, expires_at=past + timedelta(hours=24)
    )
    with django_capture_on_commit_callbacks(execute=True):  # a touch is written on commit
        assert web_alice.get(f"/sessions/{session_a.public_id}/").status_code == 200
        assert web_alice.get("/sessions/").status_code == 200
    seen = Session.objects.get(pk=session_a.pk)
    assert (seen.last_accessed_at, seen.expires_at) == (past, past + timedelta(hours=24))

    with django_capture_on_commit_callbacks(execute=True):
        assert api_a.get(f"/api/v1/sessions/{session_a.public_id}").status_code == 200  # the agent reads it
    touched = Session.objects.get(pk=session_a.pk)
    assert touched.last_accessed_at > past and touched.expires_at > past + timedelta(hours=24)
