"""Collect items during a transaction; hand them to one callback after it commits.

Django's `transaction.on_commit` runs one callback per registration. A write that records many
things (the events of a 1,000-message batch, the experiences of one transaction) wants them
together: `CommitBatch.add` collects them, and after the commit the batch's `flush` gets them in
one list, in the order they were added. Nothing of a rolled-back transaction is flushed, and
nothing added inside a savepoint that rolls back either (the rest of the transaction still is).
Outside a transaction an item is flushed at once.

The batch keeps no state of its own: its items live in the callbacks it registers with Django, one
per savepoint context that added items, which Django itself drops on a rollback. Items added in
the same open savepoints share a callback, so a transaction flushes once unless items were added
at several savepoint depths (then once per depth, still in order). `pending()` lists what the
current transaction has added so far and not rolled back. This reads `connection.run_on_commit`
(Django's `(savepoint ids, callback, robust)` entries) and `connection.savepoint_ids`;
tests/memory/test_commit_batch.py pins that behaviour on real PostgreSQL transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.db import transaction

T = TypeVar("T")


class CommitBatch(Generic[T]):
    """Items added during the current transaction, flushed in one call after it commits.

    `flush` None: the batch only remembers, for `pending()`, what this transaction added.
    """

    def __init__(self, flush: Callable[[list[T]], None] | None, *, using: str | None = None) -> None:
        self.flush = flush
        self.using = using

    def add(self, item: T) -> None:
        """Add `item` to the current transaction's batch; outside a transaction, flush it now."""
        connection = transaction.get_connection(self.using)
        if not connection.in_atomic_block:
            if self.flush is not None:
                self.flush([item])
            return
        self._group(connection).items.append(item)

    def owns(self, callback: Any) -> bool:
        """Whether `callback` (from Django's on-commit list) is one of this batch's flushes: a
        caller counting a transaction's other on-commit work leaves these out."""
        return isinstance(callback, _Group) and callback.batch is self

    def pending(self) -> list[T]:
        """What the current transaction added so far, without what a savepoint rollback undid."""
        connection = transaction.get_connection(self.using)
        if not connection.in_atomic_block:
            return []
        return [item for _, group in self._groups(connection) for item in group.items]

    def _groups(self, connection: Any) -> list[tuple[frozenset[str], _Group[T]]]:
        """This batch's callbacks with items, in order, each with the savepoints still open of those
        it was registered in (the others were released: a rollback can no longer reach them)."""
        current = set(connection.savepoint_ids)
        return [
            (frozenset(sids & current), func)
            for sids, func, _robust in connection.run_on_commit
            if isinstance(func, _Group) and func.batch is self and func.items
        ]

    def _group(self, connection: Any) -> _Group[T]:
        """The callback an item added now joins: the newest one if its open savepoints are exactly
        the current ones (a rollback then drops both), else a new one registered here."""
        if connection.run_on_commit:  # the usual case, an add right after an add: no scan
            sids, func, _robust = connection.run_on_commit[-1]
            if (
                isinstance(func, _Group)
                and func.batch is self
                and func.items
                and sids >= set(connection.savepoint_ids)
            ):
                return func
        newest: tuple[frozenset[str], _Group[T]] | None = None
        for context, group in self._groups(connection):
            if newest is not None and newest[0] == context:  # adjacent, same savepoints: one call
                newest[1].items.extend(group.items)
                group.items.clear()
            else:
                newest = (context, group)
        if newest is not None and newest[0] == frozenset(connection.savepoint_ids):
            return newest[1]
        group = _Group(self)
        transaction.on_commit(group, using=self.using)
        return group


class _Group(Generic[T]):
    """One on-commit callback of a batch: items added while its savepoints were open."""

    def __init__(self, batch: CommitBatch[T]) -> None:
        self.batch = batch
        self.items: list[T] = []

    def __call__(self) -> None:
        items, self.items = self.items, []
        if items and self.batch.flush is not None:
            self.batch.flush(items)
