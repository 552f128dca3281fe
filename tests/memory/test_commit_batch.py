"""CommitBatch on real PostgreSQL transactions: what was committed is flushed once, in order;
nothing of a rollback, nothing of a rolled-back savepoint; each transaction starts anew.

Each write creates a row and adds its name to the batch, so the test can hold the flushed names
against the rows that were actually committed.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from ctxapp.infra.commit_batch import CommitBatch
from memory.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.batch: CommitBatch[str] = CommitBatch(self.calls.append)

    def write(self, name: str) -> None:
        Tenant.objects.create(name=name, slug=name)
        self.batch.add(name)


def committed() -> list[str]:
    return list(Tenant.objects.filter(slug__startswith="cb-").order_by("pk").values_list("slug", flat=True))


def test_a_commit_flushes_its_items_once_in_order() -> None:
    rec = Recorder()
    with transaction.atomic():
        for name in ("cb-1", "cb-2", "cb-3"):
            rec.write(name)
        assert rec.calls == []  # not before the commit
        assert rec.batch.pending() == ["cb-1", "cb-2", "cb-3"]
    assert rec.calls == [["cb-1", "cb-2", "cb-3"]] == [committed()]
    assert rec.batch.pending() == []


def test_a_rollback_flushes_nothing() -> None:
    rec = Recorder()
    with pytest.raises(RuntimeError), transaction.atomic():
        rec.write("cb-1")
        raise RuntimeError("the write fails")
    with transaction.atomic():
        rec.write("cb-2")
        transaction.set_rollback(True)
    assert rec.calls == [] and committed() == []


def test_a_rolled_back_savepoint_takes_its_items_along() -> None:
    rec = Recorder()
    with transaction.atomic():
        rec.write("cb-1")
        with pytest.raises(RuntimeError), transaction.atomic():
            rec.write("cb-2")
            with transaction.atomic():
                rec.write("cb-3")
            raise RuntimeError("the inner write fails")
        assert rec.batch.pending() == ["cb-1"]
        rec.write("cb-4")
        with transaction.atomic():  # a savepoint that is released: its item stays
            rec.write("cb-5")
        rec.write("cb-6")
        with transaction.atomic():  # rolled back after the last item was added
            rec.write("cb-7")
            transaction.set_rollback(True)
    assert committed() == ["cb-1", "cb-4", "cb-5", "cb-6"]
    assert rec.calls == [committed()]  # one call for all of them


def test_items_first_added_inside_a_rolled_back_savepoint_are_not_flushed() -> None:
    rec = Recorder()
    with transaction.atomic():
        with transaction.atomic():
            rec.write("cb-1")
            transaction.set_rollback(True)
        rec.write("cb-2")
    assert rec.calls == [["cb-2"]] == [committed()]


def test_items_of_nested_savepoints_arrive_in_order() -> None:
    rec = Recorder()
    with transaction.atomic():
        rec.write("cb-1")
        with transaction.atomic():
            rec.write("cb-2")
    # Added at two depths and none after: one call per depth, in order, nothing lost.
    assert [name for call in rec.calls for name in call] == committed() == ["cb-1", "cb-2"]
    assert len(rec.calls) <= 2


def test_two_transactions_in_a_row_flush_separately() -> None:
    rec = Recorder()
    with transaction.atomic():
        rec.write("cb-1")
    with transaction.atomic():
        rec.write("cb-2")
        rec.write("cb-3")
    assert rec.calls == [["cb-1"], ["cb-2", "cb-3"]]


def test_outside_a_transaction_an_item_is_flushed_at_once() -> None:
    rec = Recorder()
    rec.write("cb-1")
    assert rec.calls == [["cb-1"]] == [committed()]


def test_two_batches_keep_their_own_items() -> None:
    first, second = Recorder(), Recorder()
    with transaction.atomic():
        first.write("cb-1")
        second.write("cb-2")
        first.write("cb-3")
    assert first.calls == [["cb-1", "cb-3"]] and second.calls == [["cb-2"]]
