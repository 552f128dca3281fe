"""User memories embedded by a real Celery worker through the outbox, and two corrections of one
version racing: one wins, the other is told the memory was superseded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from memory.models import EmbeddingStatus, JobIntent, Tenant, UserMemory
from memory.services import jobs
from memory.services.user_memory.memories import MemorySuperseded, user_memory_update, user_scope
from memory.services.user_memory.store import Recorded, memory_record
from tests.helpers import run_together


def _wait_for(condition: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return bool(condition())


@pytest.mark.django_db(transaction=True)
def test_the_worker_embeds_every_new_version(celery_worker: Any) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    first = memory_record(tenant=tenant, user_id="u-1", subject="home", text="Lives in Porto").memory
    for subject, text in (("pet", "Has a puppy named Miso"), ("diet", "Vegetarian")):
        memory_record(tenant=tenant, user_id="u-1", subject=subject, text=text)
    pending = UserMemory.objects.filter(tenant=tenant, embedding_status=EmbeddingStatus.PENDING)
    assert _wait_for(lambda: not pending.exists()), list(pending.values_list("subject", flat=True))
    assert UserMemory.objects.filter(tenant=tenant, embedding_status=EmbeddingStatus.COMPLETED).count() == 3

    scope = user_scope(tenant=tenant, user_id="u-1")
    fixed = user_memory_update(scope=scope, memory_id=first.public_id, text="Moved to Lisbon").memory
    assert _wait_for(
        lambda: UserMemory.objects.get(pk=fixed.pk).embedding_status == EmbeddingStatus.COMPLETED
    )
    old_vector, new_vector = (UserMemory.objects.get(pk=pk).embedding for pk in (first.pk, fixed.pk))
    assert old_vector is not None and new_vector is not None and list(old_vector) != list(new_vector)
    intents = JobIntent.objects.filter(kind=jobs.USER_MEMORY_EMBED)
    assert set(intents.values_list("status", flat=True)) == {"done"}


@pytest.mark.django_db(transaction=True)
def test_two_corrections_of_one_version_racing_write_one_version() -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    memory = memory_record(tenant=tenant, user_id="u-1", subject="job", text="Works at Acme").memory
    scope = user_scope(tenant=tenant, user_id="u-1")

    def correct(text: str) -> Callable[[], Recorded]:
        return lambda: user_memory_update(scope=scope, memory_id=memory.public_id, text=text)

    results, errors = run_together([correct("Works at Initech"), correct("Works at Globex")])
    assert len(results) == 1 and len(errors) == 1 and isinstance(errors[0], MemorySuperseded)
    current = UserMemory.objects.filter(tenant=tenant, subject="job", valid_to__isnull=True)
    assert [m.text for m in current] == [results[0].memory.text]
    assert UserMemory.objects.filter(tenant=tenant, subject="job").count() == 2
