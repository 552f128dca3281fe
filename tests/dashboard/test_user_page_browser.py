"""The user page in real headless Chromium against a real server: the history opens per subject,
a memory recorded meanwhile appears live, the forget form erases nothing until the user id is
typed, and then erases the user and shows the receipt."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from memory.models import Membership, MembershipRole, Tenant, UserMemory
from memory.services import sessions as sessions_service
from memory.services.user_memory.store import memory_record
from tests.dashboard.test_browser import browser, login, server, server_user, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
__all__ = ["browser", "server"]  # fixtures, used by name


@pytest.fixture
def ada_setup(transactional_db: None) -> dict[str, Any]:
    tenant = Tenant.objects.create(name="Ada's team", slug="ada")
    Membership.objects.create(user=server_user("ada"), tenant=tenant, role=MembershipRole.ADMIN)
    session = sessions_service.session_create(tenant=tenant, agent_external_id="concierge", user_id="u-42")
    memory_record(
        tenant=tenant, user_id="u-42", subject="home.city", text="Lives in Porto.", agent="concierge",
        at=timezone.now() - timedelta(days=30),
    )  # fmt: skip
    memory_record(
        tenant=tenant, user_id="u-42", subject="home.city", text="Moved to Lisbon.", agent="concierge"
    )
    return {"tenant": tenant, "session": session}


def recorded_elsewhere(tenant: Any) -> None:
    try:
        memory_record(
            tenant=tenant, user_id="u-42", subject="pets.dog", text="Has a beagle, Miso.", agent="concierge"
        )
    finally:
        connection.close()


def test_an_admin_reads_a_users_memories_live_and_the_forget_form_needs_the_id(
    ada_setup: dict[str, Any], server: str, browser: Any
) -> None:
    tenant, session = ada_setup["tenant"], ada_setup["session"]
    page, console = login(browser, server, "ada")
    page.goto(f"{server}/sessions/{session.public_id}/")
    page.click("a[href='/users/u-42/']")
    page.wait_for_url(f"{server}/users/u-42/")
    wait_live(page)
    row = page.locator("tr[data-subject='home.city']")
    assert "Moved to Lisbon." in row.inner_text()
    assert not page.locator("text=Lives in Porto.").is_visible()  # the history is folded
    row.locator("summary").click()
    assert page.locator("text=Lives in Porto.").is_visible()

    # A write as the server makes it: in a thread of its own (this one runs Playwright's event
    # loop, where a live update cannot be sent synchronously).
    with ThreadPoolExecutor(1) as pool:
        pool.submit(recorded_elsewhere, tenant).result(30)
    page.wait_for_selector("tr[data-subject='pets.dog']", timeout=10_000)

    page.fill("[data-testid=forget-confirm]", "u-4")
    page.click("[data-testid=forget-button]")
    page.wait_for_selector(".flash")
    assert "Nothing was erased" in page.locator(".flash").inner_text()
    assert UserMemory.objects.filter(tenant=tenant, user_id="u-42", valid_to__isnull=True).count() == 2

    page.fill("[data-testid=forget-confirm]", "u-42")
    page.click("[data-testid=forget-button]")
    page.wait_for_selector("[data-testid=forget-receipt]")
    assert "user_memories" in page.locator("[data-testid=forget-receipt]").inner_text()
    assert not UserMemory.objects.filter(tenant=tenant, user_id="u-42").exists()
    assert console.errors == []
    gone = page.goto(f"{server}/users/u-42/")
    assert gone is not None and gone.status == 404 and "Lisbon" not in page.content()
