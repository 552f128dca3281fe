"""The memory search box on the session and agent pages (htmx partial)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from memory.services import message_indexing

pytestmark = pytest.mark.django_db


def test_the_session_and_agent_pages_carry_the_search_box(web_alice: Client, session_a: Any) -> None:
    for url in (f"/sessions/{session_a.public_id}/", "/agents/triage-bot/"):
        page = web_alice.get(url).content.decode()
        assert 'id="memory-search-panel"' in page and 'hx-get="/memory/search"' in page


def test_it_shows_ranked_results_with_scores(web_alice: Client, session_a: Any) -> None:
    message_indexing.memory_index_drain()
    body = web_alice.get(
        "/memory/search", {"q": "checkout 502 error", "session": session_a.public_id}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert 'data-testid="memory-results"' in body
    assert "The checkout page returns 502 since 09:14." in body
    assert 'class="score"' in body and "dense" in body
    agent = web_alice.get("/memory/search", {"q": "checkout", "agent": "triage-bot"}).content.decode()
    assert "The checkout page returns 502" in agent


def test_another_tenants_session_is_404(web_bob: Client, session_a: Any) -> None:
    response = web_bob.get("/memory/search", {"q": "checkout", "session": session_a.public_id})
    assert response.status_code == 404
    assert web_bob.get("/memory/search", {"q": "checkout", "agent": "triage-bot"}).status_code == 404
    body = web_bob.get("/memory/search", {"q": "checkout"}).content.decode()
    assert "502" not in body
