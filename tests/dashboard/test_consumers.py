"""The live channel, through Channels' WebsocketCommunicator, on the real (Redis) channel layer.

Needs committed data (the consumer reads from other threads), hence transactional_db.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.test import Client

from dashboard.routing import websocket_urlpatterns
from memory.models import Tenant
from memory.services import sessions as sessions_service

pytestmark = pytest.mark.django_db(transaction=True)

application = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    """Run `scenario` in an event loop of its own. A scenario must disconnect every communicator
    it opened, refused ones included."""
    async_to_sync(scenario)()


def session_cookie(user: Any) -> str:
    try:
        client = Client()
        client.force_login(user)
        return str(client.cookies["sessionid"].value)
    finally:
        connection.close()  # this thread's connection would outlive the test database


def communicator(user: Any, query: str) -> WebsocketCommunicator:
    """A websocket carrying the session cookie of `user` logged in (none for AnonymousUser)."""
    headers = []
    if user.is_authenticated:
        # Called inside the event loop: log in from a plain thread, as the ORM requires.
        with ThreadPoolExecutor(1) as pool:
            cookie = pool.submit(session_cookie, user).result()
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, f"/ws/dashboard/?{query}", headers=headers)


@database_sync_to_async
def append(tenant: Tenant, session: Any, *contents: str) -> None:
    sessions_service.messages_append(
        tenant=tenant,
        session=session,
        items=[sessions_service.MessageInput(role="user", content=c) for c in contents],
    )


@database_sync_to_async
def new_session(tenant: Tenant, agent: str) -> Any:
    return sessions_service.session_create(tenant=tenant, agent_external_id=agent)


async def frames_until(comm: WebsocketCommunicator, needle: str, *, limit: int = 10) -> list[str]:
    """Frames received until one contains `needle` (fails after `limit` frames or a 5 s silence)."""
    frames = []
    for _ in range(limit):
        frames.append(await comm.receive_from(timeout=5))
        if needle in frames[-1]:
            return frames
    raise AssertionError(f"{needle!r} never arrived in {len(frames)} frames")


def test_it_refuses_anonymous_users(tenant_a: Tenant) -> None:
    async def scenario() -> None:
        comm = communicator(AnonymousUser(), "tenant=alice&page=overview")
        connected, _ = await comm.connect()
        assert connected is False
        await comm.disconnect()  # ends the consumer (and its channel-layer receive) before the loop

    run(scenario)


def test_it_refuses_a_non_member(tenant_a: Tenant, bob: Any) -> None:
    """Bob should have no access to Alice's stuff: the handshake itself is refused."""

    async def scenario() -> None:
        comm = communicator(bob, "tenant=alice&page=overview")
        connected, _ = await comm.connect()
        assert connected is False
        await comm.disconnect()

    run(scenario)


def test_it_refuses_another_tenants_session_id(tenant_a: Tenant, bob: Any, session_a: Any) -> None:
    async def scenario() -> None:
        comm = communicator(bob, f"tenant=bob&page=session&session={session_a.public_id}")
        connected, _ = await comm.connect()
        assert connected is False
        await comm.disconnect()
        unknown_page = communicator(bob, "tenant=bob&page=nonsense")
        assert (await unknown_page.connect())[0] is False
        await unknown_page.disconnect()

    run(scenario)


def test_a_member_gets_live_messages_of_their_session_only(
    tenant_a: Tenant, tenant_b: Tenant, alice: Any, session_a: Any
) -> None:
    async def scenario() -> None:
        other_session_a = await new_session(tenant_a, "other-bot")
        session_b = await new_session(tenant_b, "bobs-bot")
        comm = communicator(alice, f"tenant=alice&page=session&session={session_a.public_id}")
        connected, _ = await comm.connect()
        assert connected is True
        await comm.send_to(text_data=json.dumps({"hello": {"last_seq": session_a.message_seq}}))
        first = await frames_until(comm, "panel-session-header")
        assert "msg-" not in "".join(first)  # nothing new yet

        await append(tenant_b, session_b, "Bob's secret message")
        await append(tenant_a, other_session_a, "Another session of Alice")
        await append(tenant_a, session_a, "Disk usage on db-2 is 97 %")
        frames = await frames_until(comm, "msg-3")
        html = "".join(frames)
        assert "Disk usage on db-2 is 97 %" in html
        assert 'hx-swap-oob="afterbegin"' in html
        assert "Bob's secret message" not in html
        assert "Another session of Alice" not in html
        assert await comm.receive_nothing(timeout=1.0)
        await comm.disconnect()

    run(scenario)


def test_a_member_gets_events_of_their_tenant_only(tenant_a: Tenant, tenant_b: Tenant, alice: Any) -> None:
    async def scenario() -> None:
        comm = communicator(alice, "tenant=alice&page=overview")
        assert (await comm.connect())[0] is True
        await new_session(tenant_b, "bobs-bot")
        assert await comm.receive_nothing(timeout=1.5)  # Bob's event never reaches Alice
        await new_session(tenant_a, "alices-bot")
        frames = await frames_until(comm, "panel-overview-events")
        html = "".join(frames)
        assert "alices-bot" in html
        assert "bobs-bot" not in html
        await comm.disconnect()

    run(scenario)


def test_a_burst_of_writes_is_coalesced_into_few_frames(tenant_a: Tenant, alice: Any, session_a: Any) -> None:
    async def scenario() -> None:
        comm = communicator(alice, f"tenant=alice&page=session&session={session_a.public_id}")
        assert (await comm.connect())[0] is True
        for i in range(30):  # thirty separate transactions, thirty group messages
            await append(tenant_a, session_a, f"burst {i}")
        frames = await frames_until(comm, "burst 29", limit=30)
        html = "".join(frames)
        assert all(f"burst {i}<" in html for i in range(30))  # nothing lost
        assert len(frames) < 30 / 3, f"{len(frames)} frames for 30 writes"
        await comm.disconnect()

    run(scenario)


def test_a_reconnect_gets_what_it_missed_without_duplicates(
    tenant_a: Tenant, alice: Any, session_a: Any
) -> None:
    async def scenario() -> None:
        await append(tenant_a, session_a, "sent while the page was offline")
        comm = communicator(alice, f"tenant=alice&page=session&session={session_a.public_id}")
        assert (await comm.connect())[0] is True
        await comm.send_to(text_data=json.dumps({"hello": {"last_seq": 2}}))  # page shows up to #2
        frames = await frames_until(comm, "msg-3")
        html = "".join(frames)
        assert "sent while the page was offline" in html
        assert 'id="msg-2"' not in html and 'id="msg-1"' not in html
        assert "panel-session-budget" in html  # every live panel re-rendered on (re)connect
        await comm.disconnect()

    run(scenario)


def test_a_reconnect_after_missing_more_than_a_page_replaces_the_list(
    tenant_a: Tenant, alice: Any, session_a: Any
) -> None:
    async def scenario() -> None:
        await append(tenant_a, session_a, *[f"offline {i}" for i in range(60)])
        comm = communicator(alice, f"tenant=alice&page=session&session={session_a.public_id}")
        assert (await comm.connect())[0] is True
        await comm.send_to(text_data=json.dumps({"hello": {"last_seq": 2}}))
        html = "".join(await frames_until(comm, "msg-62"))
        assert 'hx-swap-oob="innerHTML"' in html
        assert "Load older messages" in html
        await comm.disconnect()

    run(scenario)


def test_a_member_removed_while_connected_stops_receiving_updates(
    tenant_a: Tenant, alice: Any, session_a: Any
) -> None:
    from memory.models import Membership

    async def scenario() -> None:
        comm = communicator(alice, f"tenant=alice&page=session&session={session_a.public_id}")
        assert (await comm.connect())[0] is True
        await database_sync_to_async(Membership.objects.filter(user=alice).delete)()
        await append(tenant_a, session_a, "Alice must not see this")
        output = await comm.receive_output(timeout=5)
        assert output == {"type": "websocket.close", "code": 4403}
        assert await comm.receive_nothing(timeout=1.0)

    run(scenario)
