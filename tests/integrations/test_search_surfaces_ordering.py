"""Best first, nothing unrelated, on every surface that shows memory search: the dashboard's search
box, the MCP `memory_search` tool (through the SDK's client), `ctxapp ctx search` and the LangChain
retriever. Same fixture as tests/memory/api/test_memory_search_ordering.py (a user's hike, her
sister's wedding and a puppy; three operations experiences none of the questions is about), a real
server, the real embedder: down each list the scores never rise, and no unrelated experience is
listed at all (the relevance floor, not merely a low rank)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from ctxapp.cli import main
from ctxapp.client import Client
from ctxapp.integrations.langchain import CtxappRetriever
from memory.models import Membership, MembershipRole, Tenant
from memory.services.tenancy import api_key_create
from tests.dashboard.conftest import logged_in, make_user
from tests.memory.api.test_memory_search_ordering import UNRELATED, user_memory
from tests.test_mcp import data, http_client

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["user_memory"]  # the shared fixture, used by name below

QUESTIONS = ("Where is Lina's wedding?", "What is my puppy called?")
UNRELATED_WORDS = [text for pair in UNRELATED.values() for text in pair]


def assert_best_first_and_nothing_unrelated(hits: list[tuple[float, str]]) -> None:
    """`hits`: (score, text) in the order the surface shows them."""
    assert hits, "the user's own memory answers every question"
    scores = [score for score, _ in hits]
    assert all(a >= b for a, b in itertools.pairwise(scores)), scores
    shown = [text for _, text in hits]
    assert not [t for t in shown if any(u in t or t in u for u in UNRELATED_WORDS)], shown


@pytest.fixture
def key(tenant_a: Tenant, user_memory: None) -> str:
    return api_key_create(tenant=tenant_a, name="surfaces")[1]


@pytest.mark.parametrize("question", QUESTIONS)
def test_the_dashboard_search_box(tenant_a: Tenant, user_memory: None, question: str) -> None:
    user = make_user("dora")
    Membership.objects.create(user=user, tenant=tenant_a, role=MembershipRole.VIEWER)
    body = logged_in(user).get("/memory/search", {"q": question}, HTTP_HX_REQUEST="true").content.decode()
    rows = [r for r in body.split("<tr>") if '<td class="score">' in r]
    hits = []
    for row in rows:
        score = float(row.split('<td class="score">')[1].split("</td>")[0])
        text = row.rsplit("<td>", 1)[1].split("</td>")[0].removeprefix("<strong>Maya:</strong> ")
        hits.append((score, text.replace("&#x27;", "'")))
    assert_best_first_and_nothing_unrelated(hits)


def test_the_mcp_memory_search_tool(server: str, key: str) -> None:
    async def calls() -> list[dict[str, Any]]:
        async with http_client(server, key) as client:
            return [
                data(await client.call_tool("memory_search", {"query": q, "user_id": "maya", "limit": 20}))
                for q in QUESTIONS
            ]

    for found in asyncio.run(calls()):
        assert_best_first_and_nothing_unrelated([(h["score"], h["text"]) for h in found["results"]])


def test_the_cli_search(
    server: str, key: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    monkeypatch.setenv("CTXAPP_URL", server)
    monkeypatch.setenv("CTXAPP_API_KEY", key)
    monkeypatch.setenv("HOME", str(tmp_path))
    for question in QUESTIONS:
        assert main(["ctx", "search", question, "--user-id", "maya", "--limit", "20", "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert_best_first_and_nothing_unrelated([(h["score"], h["text"]) for h in found["results"]])


def test_the_langchain_retriever(server: str, key: str) -> None:
    with Client(server, key) as client:
        retriever = CtxappRetriever(client=client, user_id="maya", k=20)
        for question in QUESTIONS:
            docs = retriever.invoke(question)
            assert_best_first_and_nothing_unrelated([(d.metadata["score"], d.page_content) for d in docs])
