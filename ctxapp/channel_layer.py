"""The Redis-less channel layer: channels_postgres, with group membership that cannot leak.

channels_postgres 1.1 removes a channel from a group through the Django ORM on a database alias
named `channels_postgres` (`GroupChannel.objects.using("channels_postgres")`), while everything
else goes through its own psycopg pool built from the layer's CONFIG. Without that alias every
`group_discard` (each closed dashboard tab) raised `ConnectionDoesNotExist` and left the
membership row behind, and every later event was written once more per dead channel. It also
inserted a new membership row on every `group_add`, never skipped expired ones, and with the
default `group_expiry` of 0 never deleted them.

This subclass (BACKEND `ctxapp.channel_layer.PostgresChannelLayer`):

1. discards through the layer's own pool (no alias needed);
2. keeps one row per (group, channel): `group_add` refreshes its expiry (a heartbeat), and
   deletes memberships already expired;
3. sends only to memberships not expired, so a channel whose process died without discarding
   (SIGKILL, a crash) stops costing a row per event after `group_expiry` seconds
   (CTXAPP_CHANNEL_GROUP_EXPIRY). Dashboard consumers renew their membership every third of it.

It also adds `close()`: channels_postgres starts a listener task (LISTEN on a connection of its
own, an endless `async for` over its notifications) and a module-level connection pool on the
first `receive`, and offers no way to stop either; an event loop that ends with them still
running waits for them (a test's `async_to_sync` hung at its end). Its own way out, a
`'1:shutdown'` NOTIFY, would stop the listener of every process on the database, so `close()`
cancels this process's task instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from channels_postgres import core
from channels_postgres import db as layer_db
from channels_postgres.db import GROUP_CHANNEL_TABLE, MESSAGE_TABLE, DatabaseLayer, utc_now
from psycopg import sql

DEFAULT_GROUP_EXPIRY = 300
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
    async def _execute(self, statement: Any, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        pool = await self.get_db_pool(db_params=self.db_params)
        async with pool.connection() as conn, conn.cursor() as cursor:
            await cursor.execute(statement, params)
            return await cursor.fetchall() if cursor.description else []

    async def delete_channel_group(self, group_key: str, channel: str) -> None:
        await self._execute(
            sql.SQL("DELETE FROM {table} WHERE group_key = %s AND channel = %s").format(
                table=sql.Identifier(GROUP_CHANNEL_TABLE)
            ),
            (group_key, channel),
        )

    async def add_channel_to_group(self, group_key: str, channel: str, expire: int) -> None:
        now = utc_now()
        table = sql.Identifier(GROUP_CHANNEL_TABLE)
        # One statement: drop this membership's old row and every expired one, insert the new row.
        await self._execute(
            sql.SQL(
                "WITH gone AS (DELETE FROM {table} WHERE (group_key = %s AND channel = %s) OR expire < %s) "
                "INSERT INTO {table} (group_key, channel, expire) VALUES (%s, %s, %s)"
            ).format(table=table),
            (group_key, channel, now, group_key, channel, now + timedelta(seconds=expire)),
        )
        # Messages delivered through NOTIFY stay in the table until they expire (60 s); this is
        # where expired ones go (every join and every membership renewal).
        await self._execute(
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
        await self._execute(_GROUP_SEND[True], (message, now + timedelta(seconds=expire), group_key, now))

    async def retrieve_group_channels(self, group_key: str) -> list[str]:
        rows = await self._execute(
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
        self._listener: asyncio.Task[None] | None = None

    async def listen_to_all_channels(self) -> None:
        self._listener = asyncio.current_task()
        await super().listen_to_all_channels()

    async def close(self) -> None:
        """Stop listening and close the layer's connections; call it on the loop that received.

        Cancels this process's listener task (its LISTEN connection closes with it), forgets the
        channels' advisory locks (held on pool connections), and closes channels_postgres'
        module-level pool. The layer can be used again afterwards: the next `receive` starts a
        new listener and the next query a new pool.
        """
        task, self._listener = self._listener, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.listener_task_is_running is not None:
            self.listener_task_is_running.clear()
        self.event_loop = None
        self._channel_advisory_locks.clear()
        # channels_postgres guards its pool's creation with a module-level asyncio.Lock, which
        # binds to the first loop that waits on it: the next loop to use the layer gets a new one.
        layer_db.is_creating_connection_pool = asyncio.Lock()
        pool, layer_db.connection_pool = layer_db.connection_pool, None
        if pool is None:
            return
        runner = getattr(pool, "_sched_runner", None)
        if isinstance(runner, asyncio.Task) and runner.get_loop().is_closed():
            # Created under a sync caller's `async_to_sync`, whose loop has ended: its worker
            # tasks can no longer run, so close its idle connections directly.
            for conn in list(getattr(pool, "_pool", ())):
                conn.pgconn.finish()
            return
        await pool.close()

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        # channels_postgres looks the members up by the bare group name (never matching) only to
        # create local queues, then sends by group key; send by group key alone.
        self.require_valid_group_name(group)
        await self.django_db.send_to_channel(self._group_key(group), self.serialize(message), self.expiry)

    def members_sql(self, group: str, placeholder: str = "%s") -> tuple[str, str]:
        """Whether `group` has a live member now: a boolean SQL expression with one parameter
        (written as `placeholder`), and that parameter's value. A write asks it inside its own
        statement and skips its send when no page listens (the round trip of the send is most of
        the live update's cost)."""
        self.require_valid_group_name(group)
        return _MEMBERS.format(placeholder=placeholder), self._group_key(group)

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
        params = (self.serialize(message), now + timedelta(seconds=self.expiry), self._group_key(group), now)
        with connection.cursor() as cursor:
            cursor.execute(_GROUP_SEND[not connection.in_atomic_block], params)

    async def group_discard(self, group: str, channel: str, expire: int | None = None) -> None:
        self.require_valid_group_name(group)
        self.require_valid_channel_name(channel)
        await self.django_db.delete_channel_group(self._group_key(group), channel)
        # (channels_postgres would also start a task here that sleeps 10-20 minutes and then
        # deletes expired messages; group_add prunes expired memberships instead.)
