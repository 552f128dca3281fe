"""The Redis-less channel layer: channels_postgres, with group membership that cannot leak.

channels_postgres 1.1 removes a channel from a group through the Django ORM on a database alias
named `channels_postgres` (`GroupChannel.objects.using("channels_postgres")`), while everything
else goes through its own psycopg pool built from the layer's CONFIG. Without that alias every
`group_discard` (each closed dashboard tab) raised `ConnectionDoesNotExist` and left the
membership row behind, and every later event was written once more per dead channel. It also
inserted a new membership row on every `group_add`, never skipped expired ones, and with the
default `group_expiry` of 0 never deleted them.

This subclass (BACKEND `ctxapp.infra.channel_layer.PostgresChannelLayer`):

1. discards through the layer's own pool (no alias needed);
2. keeps one row per (group, channel): `group_add` refreshes its expiry (a heartbeat), and
   deletes memberships already expired;
3. sends only to memberships not expired, so a channel whose process died without discarding
   (SIGKILL, a crash) stops costing a row per event after `group_expiry` seconds
   (CTXAPP_CHANNEL_GROUP_EXPIRY). Dashboard consumers renew their membership every third of it.

It receives through public methods only (`receive`, `listen_to_all_channels`) with state of
its own, on a pool of its own, so it never resets channels_postgres' internals: its listener
LISTENs again after the database went away (channels_postgres' ended with its connection and
`receive` then waited forever), and `close()` stops it (channels_postgres offers no way; its
`'1:shutdown'` NOTIFY would stop the listener of every process on the database). The methods it
overrides or relies on are pinned by tests/test_library_contracts.py (channels-postgres==1.1.4).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool
from channels_postgres import core
from channels_postgres.db import GROUP_CHANNEL_TABLE, MESSAGE_TABLE, DatabaseLayer, utc_now
from psycopg import sql

logger = logging.getLogger(__name__)

DEFAULT_GROUP_EXPIRY = 300
# Between attempts to LISTEN again after the database went away: a restarted server is heard
# from within this (plus the connect) of its return.
RECONNECT_DELAY = 1.0
POOL_OPEN_TIMEOUT = 5.0
# Joined into a statement run in autocommit: its own implicit transaction commits without waiting
# for the WAL flush (the setting is local to that transaction).
_ASYNCHRONOUS_COMMIT = ", (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode"


def _group_send_sql(*, asynchronous: bool) -> str:
    """A message to every live member of a group in ONE statement: a row per member (the table's
    trigger NOTIFYs each), none when the group has no member."""
    return (
        sql.SQL(
            "INSERT INTO {messages} (channel, message, expire) "
            "SELECT DISTINCT channel, %s::bytea, %s::timestamptz FROM {groups}{asynchronous} "
            "WHERE group_key = %s AND expire >= %s"
        )
        .format(
            messages=sql.Identifier(MESSAGE_TABLE),
            groups=sql.Identifier(GROUP_CHANNEL_TABLE),
            asynchronous=sql.SQL(_ASYNCHRONOUS_COMMIT if asynchronous else ""),
        )
        .as_string()
    )


# Whether a group has a live member; `{placeholder}` is the caller's parameter style.
_MEMBERS = (
    sql.SQL("EXISTS (SELECT 1 FROM {groups} WHERE group_key = ")
    .format(groups=sql.Identifier(GROUP_CHANNEL_TABLE))
    .as_string()
    + "{placeholder} AND expire >= now())"
)
_GROUP_SEND = {asynchronous: _group_send_sql(asynchronous=asynchronous) for asynchronous in (False, True)}


class _Database(DatabaseLayer):
    """The layer's queries, on a connection pool of the layer's own.

    channels_postgres keeps one module-level pool behind a module-level asyncio.Lock, both bound
    to the first event loop that uses them, and never notices a database that went away. This
    pool belongs to one layer and one loop (a new loop gets a new pool), and `renew_pool()`
    replaces it whole once the listener has reconnected: a restarted server leaves every idle
    connection broken. (Checking each connection before lending it would cost a round trip per
    query; a broken one fails its query once and the pool discards it.)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool_loop: asyncio.AbstractEventLoop | None = None
        self.opening: asyncio.Task[psycopg_pool.AsyncConnectionPool] | None = None

    async def get_db_pool(self, db_params: dict[str, Any] | None = None) -> psycopg_pool.AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        opening = self.opening
        failed = opening is not None and opening.done() and (opening.cancelled() or opening.exception())
        if opening is None or failed or self.pool_loop is not loop:
            # A pool of another loop (an ended `async_to_sync`) is dropped: its tasks cannot run.
            self.pool_loop, self.opening = loop, loop.create_task(self.open_pool())
            opening = self.opening
        return await asyncio.shield(opening)

    async def open_pool(self) -> psycopg_pool.AsyncConnectionPool:
        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.set_autocommit(True)
            conn.prepare_threshold = 0
            conn.prepared_max = None

        pool = psycopg_pool.AsyncConnectionPool(
            conninfo=psycopg.conninfo.make_conninfo(conninfo="", **self.db_params),
            open=False,
            configure=configure,
            **self.psycopg_options,
        )
        try:
            await pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT)
        except BaseException:
            await pool.close()
            raise
        return pool

    async def close_pool(self) -> None:
        opening, self.opening = self.opening, None
        if opening is None or self.pool_loop is not asyncio.get_running_loop():
            return
        if not opening.done():
            opening.cancel()
        try:
            pool = await opening
        except (Exception, asyncio.CancelledError):
            return
        await pool.close()

    async def renew_pool(self) -> None:
        await self.close_pool()
        await self.get_db_pool()

    async def execute(self, statement: Any, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        pool = await self.get_db_pool()
        async with pool.connection() as conn, conn.cursor() as cursor:
            await cursor.execute(statement, params)
            return await cursor.fetchall() if cursor.description else []

    async def delete_channel_group(self, group_key: str, channel: str) -> None:
        await self.execute(
            sql.SQL("DELETE FROM {table} WHERE group_key = %s AND channel = %s").format(
                table=sql.Identifier(GROUP_CHANNEL_TABLE)
            ),
            (group_key, channel),
        )

    async def add_channel_to_group(self, group_key: str, channel: str, expire: int) -> None:
        now = utc_now()
        table = sql.Identifier(GROUP_CHANNEL_TABLE)
        # One statement: drop this membership's old row and every expired one, insert the new row.
        await self.execute(
            sql.SQL(
                "WITH gone AS (DELETE FROM {table} WHERE (group_key = %s AND channel = %s) OR expire < %s) "
                "INSERT INTO {table} (group_key, channel, expire) VALUES (%s, %s, %s)"
            ).format(table=table),
            (group_key, channel, now, group_key, channel, now + timedelta(seconds=expire)),
        )
        # Messages delivered through NOTIFY stay in the table until they expire (60 s); this is
        # where expired ones go (every join and every membership renewal).
        await self.execute(
            sql.SQL("DELETE FROM {table} WHERE expire < %s").format(table=sql.Identifier(MESSAGE_TABLE)),
            (now,),
        )

    async def send_to_channel(
        self, group_key: str, message: bytes, expire: int, channel: str | None = None
    ) -> None:
        """To one channel as channels_postgres does; to a group in one statement (channels_postgres
        reads the members, then inserts, and logs a warning for a group without members: on the
        server that was two round trips and a log line for every write with no dashboard open)."""
        if channel is not None:
            await super().send_to_channel(group_key, message, expire, channel)
            return
        now = utc_now()
        await self.execute(_GROUP_SEND[True], (message, now + timedelta(seconds=expire), group_key, now))

    async def retrieve_group_channels(self, group_key: str) -> list[str]:
        rows = await self.execute(
            sql.SQL("SELECT DISTINCT channel FROM {table} WHERE group_key = %s AND expire >= %s").format(
                table=sql.Identifier(GROUP_CHANNEL_TABLE)
            ),
            (group_key, utc_now()),
        )
        return [row[0] for row in rows]


class PostgresChannelLayer(core.PostgresChannelLayer):
    def __init__(self, *args: Any, group_expiry: int = DEFAULT_GROUP_EXPIRY, **kwargs: Any) -> None:
        super().__init__(*args, group_expiry=group_expiry, **kwargs)
        base: DatabaseLayer = self.django_db  # type: ignore[has-type]
        self.django_db = _Database(base.psycopg_options, self.db_params, logger=base.logger)
        self.listener: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        self.queues: dict[str, asyncio.Queue[str]] = {}
        self.locked: set[str] = set()  # channels whose advisory lock this process took
        self.delivered_up_to = 0  # the highest message id queued: a replay after a reconnect skips it

    async def receive(self, channel: str) -> dict[str, Any]:
        """The next message on `channel`, as channels_postgres delivers it (the receiver that holds
        the channel's advisory lock gets it), from a listener that outlives a database restart."""
        self.require_valid_channel_name(channel)
        if "!" in channel:
            assert self.non_local_name(channel).endswith(self.client_prefix + "!"), "Wrong client prefix"
        queue = self.queues.setdefault(channel, asyncio.Queue())
        if channel not in self.locked and await self.django_db.acquire_advisory_lock(channel):
            self.locked.add(channel)
        self.start_listener()
        await self.listening.wait()
        while True:
            payload = await queue.get()
            message_id, _, rest = payload.partition(":")
            parts = rest.split(":")
            if len(parts) == 3:  # small messages travel in the NOTIFY payload itself
                if float(parts[2]) < time.time():
                    continue
                return self.deserialize(base64.b64decode(parts[1]))
            row = await self.django_db.delete_message_returning_message(int(message_id))
            if row is not None:
                return self.deserialize(row[0])

    def start_listener(self) -> None:
        loop = asyncio.get_running_loop()
        task = self.listener
        if task is None or task.done() or task.get_loop() is not loop:
            self.listening = asyncio.Event()
            self.listener = loop.create_task(self.listen_to_all_channels())

    async def listen_to_all_channels(self) -> None:
        """LISTEN for the messages of every channel, and LISTEN again after the database went away.

        channels_postgres' listener ends with its connection, and its `receive` keeps waiting on
        it forever: after a restart of PostgreSQL no live update reached a page again. This one
        retries every RECONNECT_DELAY seconds; once it listens again it renews the layer's pool
        (whose connections died with the server) and replays the messages stored meanwhile."""
        reconnecting = False
        while True:
            try:
                await self.listen_once(reconnecting=reconnecting)
                return
            except (psycopg.Error, psycopg_pool.PoolTimeout, OSError) as exc:
                self.listening.clear()
                if not reconnecting:
                    logger.warning("channel layer: lost its database connection (%s); reconnecting", exc)
                reconnecting = True
                await asyncio.sleep(RECONNECT_DELAY)

    async def listen_once(self, *, reconnecting: bool) -> None:
        conninfo = psycopg.conninfo.make_conninfo(conninfo="", **self.db_params)
        connect = psycopg.AsyncConnection.connect(conninfo, autocommit=True, connect_timeout=5)
        async with await connect as conn:
            await conn.execute("LISTEN channels_postgres_messages")
            if reconnecting:
                await self.django_db.renew_pool()
                logger.warning("channel layer: listening again")
            stored = await self.django_db.retrieve_non_expired_queued_messages()
            for row in sorted(stored, key=lambda r: int(r[0])):
                message_id, channel, message, timestamp = row
                self.deliver(f"{message_id}:{channel}:{base64.b64encode(message).decode()}:{timestamp}")
            self.listening.set()
            async for event in conn.notifies():
                if event.payload == "1:shutdown":
                    return
                self.deliver(event.payload)

    def deliver(self, payload: str) -> None:
        message_id, _, rest = payload.partition(":")
        channel = rest.split(":", 1)[0]
        if channel not in self.locked or int(message_id) <= self.delivered_up_to:
            return  # another receiver holds the channel, or it was queued before an outage
        self.delivered_up_to = int(message_id)
        self.queues.setdefault(channel, asyncio.Queue()).put_nowait(payload)

    def group_key(self, group: str) -> str:
        """The stored key of `group`, as channels_postgres' `group_add` writes it."""
        return f"{self.prefix}:group:{group}"

    def is_listening(self, channel: str) -> bool:
        """Whether a `receive(channel)` here gets the channel's next message (it holds the channel
        and the listener is connected)."""
        return channel in self.locked and self.listening.is_set()

    async def close(self) -> None:
        """Stop listening and close the layer's connections; call it on the loop that received.

        Cancels this process's listener task (its LISTEN connection closes with it), forgets the
        channels' advisory locks (held on pool connections) and closes the layer's pool. The layer
        can be used again afterwards: the next `receive` starts a new listener and the next query
        a new pool. (channels_postgres' own way out, a `'1:shutdown'` NOTIFY, would stop the
        listener of every process on the database.)"""
        task, self.listener = self.listener, None
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.listening.clear()
        self.locked.clear()
        await self.django_db.close_pool()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        # channels_postgres looks the members up by the bare group name (never matching) only to
        # create local queues, then sends by group key; send by group key alone.
        self.require_valid_group_name(group)
        await self.django_db.send_to_channel(self.group_key(group), self.serialize(message), self.expiry)

    def members_sql(self, group: str, placeholder: str = "%s") -> tuple[str, str]:
        """Whether `group` has a live member now: a boolean SQL expression with one parameter
        (written as `placeholder`), and that parameter's value. A write asks it inside its own
        statement and skips its send when no page listens (the round trip of the send is most of
        the live update's cost)."""
        self.require_valid_group_name(group)
        return _MEMBERS.format(placeholder=placeholder), self.group_key(group)

    def group_send_sync(self, connection: Any, group: str, message: dict[str, Any]) -> None:
        """`group_send` from synchronous code, in ONE statement on Django's `connection` (to the
        same database): a row per live member, as `group_send` writes them (the table's trigger
        NOTIFYs each). No event loop, no thread, no connection pool of the layer's own.

        In autocommit the statement commits asynchronously (`synchronous_commit` off for its own
        implicit transaction only): a crash may lose a live update, a WAL flush never delays one.
        Inside a transaction it is delivered when that transaction commits.
        """
        self.require_valid_group_name(group)
        now = utc_now()
        params = (self.serialize(message), now + timedelta(seconds=self.expiry), self.group_key(group), now)
        with connection.cursor() as cursor:
            cursor.execute(_GROUP_SEND[not connection.in_atomic_block], params)

    async def group_discard(self, group: str, channel: str, expire: int | None = None) -> None:
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        await self.django_db.delete_channel_group(self.group_key(group), channel)
        # (channels_postgres would also start a task here that sleeps 10-20 minutes and then
        # deletes expired messages; group_add prunes expired memberships instead.)
