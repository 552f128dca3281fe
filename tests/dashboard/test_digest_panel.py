"""The session page shows the session's digest (medium-term memory); Bob never sees Alice's."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dashboard.panels import panel_is_stale, panel_render
from memory.models import Tenant
from memory.services import sessions as sessions_service
from memory.services.session_digest import session_digest_update

pytestmark = pytest.mark.django_db


def test_the_session_page_shows_the_latest_digest_by_category(
    web_alice: Client, web_bob: Client, tenant_a: Tenant, session_a: Any
) -> None:
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert "No digest yet" in page
    sessions_service.messages_append(
        tenant=tenant_a,
        session=session_a,
        items=[
            sessions_service.MessageInput(
                role="user", content="I need to get checkout back under 1% errors."
            ),
            sessions_service.MessageInput(
                role="assistant", content="We decided to roll back the canary on web-3."
            ),
        ],
    )
    session_digest_update(tenant=tenant_a, session=session_a)
    page = web_alice.get(f"/sessions/{session_a.public_id}/").content.decode()
    assert 'id="panel-session-digest"' in page and "version 1 of 1" in page
    assert "<h3>Goals</h3>" in page and "get checkout back under 1% errors" in page
    assert "<h3>Decisions</h3>" in page and "roll back the canary on web-3" in page
    assert web_bob.get(f"/sessions/{session_a.public_id}/").status_code == 404
    # the live panel re-renders on digest events
    assert panel_is_stale("session-digest", "digest.updated")
    html = panel_render("session-digest", tenant=tenant_a, session=session_a)
    assert "roll back the canary" in html
