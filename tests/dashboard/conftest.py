"""Dashboard fixtures: Alice is a member of tenant A, Bob of tenant B, Carol is staff.

Bob should have no access to Alice's stuff, in pages and on the websocket alike.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from memory.models import Membership, MembershipRole, Tenant
from memory.services import sessions as sessions_service

PASSWORD = "correct horse battery staple"


def make_user(username: str, *, staff: bool = False) -> Any:
    return get_user_model().objects.create_user(username=username, password=PASSWORD, is_staff=staff)


@pytest.fixture
def alice(tenant_a: Tenant) -> Any:
    user = make_user("alice")
    Membership.objects.create(user=user, tenant=tenant_a, role=MembershipRole.OPERATOR)
    return user


@pytest.fixture
def bob(tenant_b: Tenant) -> Any:
    user = make_user("bob")
    Membership.objects.create(user=user, tenant=tenant_b, role=MembershipRole.VIEWER)
    return user


@pytest.fixture
def carol(db: None) -> Any:
    return make_user("carol", staff=True)


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def web_alice(alice: Any) -> Client:
    return logged_in(alice)


@pytest.fixture
def web_bob(bob: Any) -> Client:
    return logged_in(bob)


@pytest.fixture
def session_a(tenant_a: Tenant) -> Any:
    session = sessions_service.session_create(tenant=tenant_a, agent_external_id="triage-bot", user_id="u-1")
    sessions_service.messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            sessions_service.MessageInput(role="user", content="The checkout page returns 502 since 09:14."),
            sessions_service.MessageInput(
                role="assistant",
                content="Looking at the upstream pool first.",
                tool_calls=[
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "metrics.query", "arguments": '{"expr": "db_pool_in_use"}'},
                    },
                    {"id": "call_2", "name": "legacy.shape", "args": {"x": 1}},
                ],
            ),
        ],
    )
    session.refresh_from_db()
    return session
