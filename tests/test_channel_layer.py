"""The embedded mode's channel layer (ctxapp.infra.channel_layer on channels_postgres) does not leak
group membership: a closed page leaves no row behind, an event is written once per live page,
and a page whose process died stops costing a row per event once its membership expires."""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

import psycopg
import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ctxapp.infra import broadcast
from ctxapp.infra.channel_layer import PostgresChannelLayer
from memory.services import cognition, recorder
from memory.services import sessions as svc
from memory.services.sessions import agent_get_or_create
from tests.helpers import use_postgres_channel_layer

pytestmark = pytest.mark.django_db(transaction=True)


def rows(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return int(cursor.fetchone()[0])


def run(scenario: Any, *, group_expiry: int = 300) -> None:
    """Run `scenario(layer)` on a fresh layer on the test database, then close the layer's pool."""
    latest = importlib.import_module("channels_postgres.migrations.0004_notify_ensure_payload_not_too_big")
    with connection.cursor() as cursor:
        cursor.execute(latest.Migration.setup_database_sql)
    config = {**connection.settings_dict, "TIME_ZONE": None, "prefix": f"{settings.QUEUE_PREFIX}_asgi"}
    layer = PostgresChannelLayer(
        **{k: v for k, v in config.items() if k != "BACKEND"}, group_expiry=group_expiry
    )

    async def main() -> None:
        try:
            await scenario(layer)
        finally:
            await layer.close()

    asyncio.run(main())


def test_closed_pages_leave_no_membership_and_events_go_to_live_pages_once() -> None:
    async def scenario(layer: PostgresChannelLayer) -> None:
        closed = [await layer.new_channel() for _ in range(20)]
        live = await layer.new_channel()
        for channel in [*closed, live]:
            await layer.group_add("tenant.1", channel)
        await layer.group_add("tenant.1", live)  # a renewal: still one row
        for channel in closed:
            await layer.group_discard("tenant.1", channel)  # raised ConnectionDoesNotExist before
        for i in range(11):
            await layer.group_send("tenant.1", {"type": "ctx.events", "i": i})

    run(scenario)
    assert rows("channels_postgres_groupchannel") == 1
    assert rows("channels_postgres_message") == 11  # one per event for the one live page, not 21 each


def test_a_dead_pages_membership_expires_and_a_renewed_one_does_not() -> None:
    async def scenario(layer: PostgresChannelLayer) -> None:
        dead, renewed = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("tenant.1", dead)  # its process is killed: never discarded
        await layer.group_add("tenant.1", renewed)
        deadline = time.monotonic() + 10
        while (
            time.monotonic() < deadline
            and len(await layer.django_db.retrieve_group_channels(layer.group_key("tenant.1"))) == 2
        ):
            await asyncio.sleep(0.2)
            await layer.group_add("tenant.1", renewed)  # an open page renews its membership
        await layer.group_send("tenant.1", {"type": "ctx.events"})

    run(scenario, group_expiry=1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM channels_postgres_message")
        assert cursor.fetchone()[0] == 1  # only the renewed page got it
        cursor.execute("SELECT count(*) FROM channels_postgres_groupchannel")
        assert cursor.fetchone()[0] == 1  # the expired row was pruned by the renewal


def send_and_close(layer: PostgresChannelLayer, group: str, message: dict[str, Any]) -> None:
    try:
        layer.group_send_sync(connection, group, message)  # this thread's own connection
    finally:
        connection.close()


def rows_and_close(table: str) -> int:
    try:
        return rows(table)
    finally:
        connection.close()


def test_a_send_from_synchronous_code_reaches_the_live_pages_once_and_no_one_else() -> None:
    received: list[dict[str, Any]] = []
    written: list[int] = []

    async def scenario(layer: PostgresChannelLayer) -> None:
        live, other = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("tenant.1", live)
        await layer.group_add("tenant.2", other)
        # As a committed write's flush does it: one statement on Django's connection, in autocommit.
        await asyncio.to_thread(send_and_close, layer, "tenant.1", {"type": "ctx.events", "n": 1})
        written.append(await asyncio.to_thread(rows_and_close, "channels_postgres_message"))
        received.append(await asyncio.wait_for(layer.receive(live), 10))

    run(scenario)
    assert written == [1]  # for the one live page of tenant.1; none for tenant.2's page
    assert received == [{"type": "ctx.events", "n": 1}]


def test_a_group_send_is_one_statement_whether_or_not_pages_listen(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every committed write sends a live update: to a tenant with dashboards open (one row per
    # page) or without (none). channels_postgres read the members, then inserted: two round trips.
    statements: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counting(self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(str(query))
        return await execute(self, query, *args, **kwargs)

    received: list[dict[str, Any]] = []
    written: list[int] = []
    counted: list[int] = []

    async def scenario(layer: PostgresChannelLayer) -> None:
        live = await layer.new_channel()
        await layer.group_add("tenant.1", live)
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counting)
        await layer.group_send("tenant.2", {"type": "ctx.events", "i": 0})  # nobody listens
        counted.append(len(statements))
        await layer.group_send("tenant.1", {"type": "ctx.events", "i": 1})
        counted.append(len(statements))
        monkeypatch.undo()
        written.append(await asyncio.to_thread(rows_and_close, "channels_postgres_message"))
        received.append(await asyncio.wait_for(layer.receive(live), 10))

    run(scenario)
    assert counted == [1, 2]
    assert written == [1]  # the live page's row; none for the group without pages
    assert received == [{"type": "ctx.events", "i": 1}]


@pytest.fixture
def postgres_layer(settings: Any) -> None:
    """The embedded mode's channel layer as the default layer (ctxapp.infra.broadcast sends through it)."""
    use_postgres_channel_layer(settings)


def live_sends(write: Any) -> list[str]:
    """The statements `write()` sent to the channel layer's message table (this thread's connection)."""
    try:
        with CaptureQueriesContext(connection) as queries:
            write()
        return [q["sql"] for q in queries.captured_queries if "channels_postgres_message" in q["sql"]]
    finally:
        connection.close()


def watched(tenant: Any, *writes: Any) -> list[tuple[int, list[str]]]:
    """With a dashboard page of `tenant` listening, for each of `writes` in turn: (how many
    statements it sent to the layer's message table, the event types the page got)."""
    layer = get_channel_layer()
    seen: list[tuple[int, list[str]]] = []

    async def main() -> None:
        try:
            page = await layer.new_channel()
            await layer.group_add(broadcast.tenant_group(tenant.pk), page)
            for write in writes:
                sent = await asyncio.to_thread(live_sends, write)
                message = await asyncio.wait_for(layer.receive(page), 10)
                seen.append((len(sent), [event["type"] for event in message["events"]]))
        finally:
            await layer.close()

    asyncio.run(main())
    return seen


# A write's own statement asks whether a page of the tenant listens: with none, no statement
# follows the commit for the live update; with one, the page gets the event.


def test_an_append_sends_its_live_update_only_when_a_dashboard_listens(
    tenant_a: Any, postgres_layer: None
) -> None:
    session = svc.session_create(tenant=tenant_a, agent_external_id="live")

    def append(text: str) -> Any:
        return lambda: svc.messages_append(
            tenant=tenant_a, session=session, items=[svc.MessageInput(role="user", content=text)]
        )

    append("warm")()
    assert live_sends(append("nobody watches")) == []
    assert watched(tenant_a, append("someone watches")) == [(1, ["message.added"])]


def test_an_event_and_a_checkpoint_send_only_when_a_dashboard_listens(
    tenant_a: Any, postgres_layer: None
) -> None:
    def event() -> None:
        with transaction.atomic():
            recorder.event_append(tenant=tenant_a, type="agent.note", payload={"n": 1})

    agent = agent_get_or_create(tenant=tenant_a, external_id="live")

    def checkpoint(n: int) -> Any:
        return lambda: cognition.checkpoint_create(tenant=tenant_a, agent=agent, reason="test", step=n)

    checkpoint(0)()
    assert live_sends(event) == []
    assert live_sends(checkpoint(1)) == []
    seen = watched(tenant_a, event, checkpoint(2))
    assert seen[0] == (1, ["agent.note"])
    assert seen[1][0] == 1
    assert "checkpoint.created" in seen[1][1]
