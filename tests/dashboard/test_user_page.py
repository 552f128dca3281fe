"""The user page: what the tenant holds about one user (current memories, their history, the
user's sessions), linked from the session pages, live, and invisible to another tenant."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from django.utils import timezone

from memory.models import Tenant
from memory.services import sessions as sessions_service
from memory.services.user_memory.store import memory_record
from tests.dashboard.test_consumers import communicator, frames_until, run


def _remember(tenant: Tenant, subject: str, text: str, **kw: Any) -> Any:
    return memory_record(tenant=tenant, user_id="u-1", subject=subject, text=text, agent="triage-bot", **kw)


@pytest.fixture
def lisbon(tenant_a: Tenant, session_a: Any) -> Any:
    _remember(
        tenant_a, "home.city", "Lives in Porto.", memory_type="profile", at=timezone.now() - timedelta(days=9)
    )
    _remember(
        tenant_a,
        "home.city",
        "Moved to Lisbon.",
        memory_type="profile",
        sources=[{"session": session_a.public_id, "seq": 1}],
    )
    return _remember(tenant_a, "diet", "Vegetarian, no fish.", memory_type="constraint").memory


def test_the_user_page_shows_current_memories_their_history_and_sessions(
    web_alice: Client, session_a: Any, lisbon: Any
) -> None:
    response = web_alice.get("/users/u-1/")
    assert response.status_code == 200
    page = response.content.decode()
    memories = page.split('data-testid="user-memories"')[1].split("</table>")[0]
    row = re.search(r'<tr data-subject="home.city">(.*?)</tr>', memories, re.S)
    assert row is not None
    current, history = row.group(1).split('data-testid="history"')
    assert "Moved to Lisbon." in current and "Porto" not in current
    assert "1 earlier value" in history and "<s>Lives in Porto.</s>" in history and "superseded" in history
    assert "Vegetarian, no fish." in memories and "constraint" in memories
    assert f'href="/sessions/{session_a.public_id}/"' in page.split('data-testid="user-sessions"')[1]
    assert 'ws-connect="/ws/dashboard/?tenant=alice&amp;page=user&amp;user=u-1"' in page
    # Alice is an operator: the page says who may forget, and has no form for her.
    assert "Only a tenant admin can forget a user." in page and 'data-testid="forget-form"' not in page


def test_session_pages_link_their_user(web_alice: Client, session_a: Any) -> None:
    assert 'href="/users/u-1/"' in web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert 'href="/users/u-1/"' in web_alice.get("/sessions/").content.decode()


def test_another_tenants_user_and_an_unknown_one_get_the_404_page(
    web_bob: Client, web_alice: Client, lisbon: Any
) -> None:
    for client, url in [(web_bob, "/users/u-1/"), (web_alice, "/users/nobody/")]:
        response = client.get(url)
        assert response.status_code == 404
        page = response.content.decode()
        assert "No such user." in page and "Lisbon" not in page
    assert web_bob.post("/users/u-1/forget", {"confirm": "u-1"}).status_code == 404


def test_a_user_id_with_a_slash_has_a_page(tenant_a: Tenant, web_alice: Client) -> None:
    sessions_service.session_create(tenant=tenant_a, agent_external_id="triage-bot", user_id="org/42")
    assert 'href="/users/org/42/"' in web_alice.get("/sessions/").content.decode()
    assert web_alice.get("/users/org/42/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_memories_panel_updates_live_when_a_memory_changes(
    tenant_a: Tenant, alice: Any, session_a: Any
) -> None:
    record = database_sync_to_async(_remember)

    async def scenario() -> None:
        comm = communicator(alice, "tenant=alice&page=user&user=u-1")
        connected, _ = await comm.connect()
        assert connected is True
        await record(tenant_a, "pets.dog", "Has a beagle called Miso.", memory_type="profile")
        frames = await frames_until(comm, "Has a beagle called Miso.")
        assert 'id="panel-user-memories"' in frames[-1]
        await comm.disconnect()
        refused = communicator(alice, "tenant=alice&page=user&user=nobody")
        assert (await refused.connect())[0] is False
        await refused.disconnect()

    run(scenario)
