"""The user page's "Forget this user" button: admins only, behind typing the user id; it erases
through memory.services.forget.forget_user and shows the receipt; afterwards the user is gone from
the dashboard."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from memory.models import Membership, MembershipRole, Session, Tenant, UserMemory
from memory.services.user_memory.store import memory_record
from tests.dashboard.conftest import logged_in, make_user


@pytest.fixture
def web_admin(tenant_a: Tenant) -> Client:
    user = make_user("ada")
    Membership.objects.create(user=user, tenant=tenant_a, role=MembershipRole.ADMIN)
    return logged_in(user)


@pytest.fixture
def remembered(tenant_a: Tenant, session_a: Any) -> Any:
    return memory_record(
        tenant=tenant_a, user_id="u-1", subject="home.city", text="Moved to Lisbon.", agent="triage-bot"
    ).memory


def test_only_an_admin_who_types_the_user_id_can_forget(
    web_admin: Client, web_alice: Client, tenant_a: Tenant, remembered: Any
) -> None:
    page = web_admin.get("/users/u-1/").content.decode()
    assert 'data-testid="forget-form"' in page and 'action="/users/u-1/forget"' in page
    assert web_alice.post("/users/u-1/forget", {"confirm": "u-1"}).status_code == 403  # an operator
    wrong = web_admin.post("/users/u-1/forget", {"confirm": "u-2"}, follow=True)
    assert "Nothing was erased" in wrong.content.decode()
    assert UserMemory.objects.filter(tenant=tenant_a, user_id="u-1").exists()

    done = web_admin.post("/users/u-1/forget", {"confirm": "u-1"})
    assert done.status_code == 200
    receipt = done.content.decode().split('data-testid="forget-receipt"')[1]
    assert "<tr><td>user_memories</td><td>1</td></tr>" in receipt
    assert (
        "<tr><td>sessions</td><td>1</td></tr>" in receipt
        and "<tr><td>messages</td><td>2</td></tr>" in receipt
    )
    assert not UserMemory.objects.filter(tenant=tenant_a, user_id="u-1").exists()
    assert not Session.objects.filter(tenant=tenant_a, user_id="u-1").exists()
    assert "Moved to Lisbon" not in web_admin.get("/sessions/").content.decode()
    gone = web_admin.get("/users/u-1/")
    assert gone.status_code == 404 and "Lisbon" not in gone.content.decode()
