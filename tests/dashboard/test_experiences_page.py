"""The experiences page shows who recorded each experience and the texts merged into it."""

from __future__ import annotations

from django.db import transaction
from django.test import Client

from memory.models import Tenant
from memory.services import experiences


def test_it_shows_each_experiences_agent_and_merged_texts(
    web_alice: Client, web_bob: Client, tenant_a: Tenant
) -> None:
    kept = experiences.experience_create(
        tenant=tenant_a,
        problem="Checkout returns 502 after deploy",
        solution="Raise the pool size to 50",
        agent="triage-bot",
    ).experience
    for wording in ("Checkout answers 502 after a deploy", "Checkout gives 502 right after deploy"):
        duplicate = experiences.experience_create(
            tenant=tenant_a, problem=wording, solution="Raise the pool size to 50", agent="triage-bot"
        ).experience
        with transaction.atomic():
            experiences.experience_merge(tenant=tenant_a, duplicate=duplicate, into=kept, similarity=0.98)
    experiences.experience_create(tenant=tenant_a, problem="Disk full on db-2", solution="rotate WAL")

    page = web_alice.get("/experiences/").content.decode()

    assert "<th>Agent</th>" in page
    assert '<code class="agent" data-testid="experience-agent">triage-bot</code>' in page
    assert page.count('data-testid="experience-agent"') == 1  # the one without an agent shows a dash
    assert "<summary>+2 merged</summary>" in page
    assert "Problem: Checkout answers 502 after a deploy Solution: Raise the pool size to 50" in page
    assert "Problem: Checkout gives 502 right after deploy Solution: Raise the pool size to 50" in page

    results = web_alice.get("/experiences/?q=checkout+502").content.decode()
    assert 'data-testid="search-results"' in results
    assert "triage-bot" in results and "+2 merged" in results and "answers 502 after a deploy" in results

    other = web_bob.get("/experiences/").content.decode()  # another tenant sees none of it
    assert "triage-bot" not in other and "merged" not in other
