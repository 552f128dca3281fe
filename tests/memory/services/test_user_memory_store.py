"""The user memory write path: supersede on a new value, unchanged on a repeat, as_of reads."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from memory.exceptions import Conflict, InvalidInput
from memory.models import Event, Tenant, UserMemory
from memory.services.user_memory.store import memories_of, memory_history, memory_record

pytestmark = pytest.mark.django_db


def test_a_new_value_supersedes_the_current_one_and_as_of_shows_the_past(tenant_a: Tenant) -> None:
    t0 = timezone.now() - timedelta(days=30)
    first = memory_record(
        tenant=tenant_a,
        user_id="u-42",
        subject="home.city",
        text="Lives in Porto",
        memory_type="profile",
        at=t0,
    )
    assert first.outcome == "created"
    t1 = t0 + timedelta(days=10)
    second = memory_record(
        tenant=tenant_a,
        user_id="u-42",
        subject="home.city",
        text="Moved to Lisbon",
        memory_type="profile",
        sources=[{"session": "sess_x", "seq": 3}],
        at=t1,
    )
    assert second.outcome == "superseded"
    old = UserMemory.objects.get(pk=first.memory.pk)
    assert old.valid_to == t1 and old.superseded_by_id == second.memory.pk

    assert [m.text for m in memories_of(tenant=tenant_a, user_id="u-42")] == ["Moved to Lisbon"]
    past = memories_of(tenant=tenant_a, user_id="u-42", as_of=t0 + timedelta(days=1))
    assert [m.text for m in past] == ["Lives in Porto"]
    assert list(memories_of(tenant=tenant_a, user_id="u-42", as_of=t0 - timedelta(days=1))) == []
    assert [m.text for m in memory_history(second.memory)] == ["Lives in Porto", "Moved to Lisbon"]

    types = list(
        Event.objects.filter(tenant=tenant_a, type__startswith="user_memory.").values_list("type", flat=True)
    )
    assert sorted(types) == ["user_memory.recorded", "user_memory.recorded", "user_memory.superseded"]
    payloads = Event.objects.filter(tenant=tenant_a, type__startswith="user_memory.").values_list(
        "payload", flat=True
    )
    assert not any("Lisbon" in str(p) or "Porto" in str(p) for p in payloads)


def test_repeating_the_current_value_adds_its_source_only(tenant_a: Tenant) -> None:
    memory_record(
        tenant=tenant_a,
        user_id="u",
        subject="pet.dog",
        text="Has a puppy named Miso",
        sources=[{"session": "s1", "seq": 1}],
    )
    again = memory_record(
        tenant=tenant_a,
        user_id="u",
        subject="pet.dog",
        text="has a  puppy named miso",
        sources=[{"session": "s2", "seq": 7}],
    )
    assert again.outcome == "unchanged"
    assert UserMemory.objects.filter(tenant=tenant_a, user_id="u").count() == 1
    assert again.memory.sources == [{"session": "s1", "seq": 1}, {"session": "s2", "seq": 7}]


def test_bad_input_and_late_values_are_refused(tenant_a: Tenant) -> None:
    with pytest.raises(InvalidInput):
        memory_record(tenant=tenant_a, user_id="u", subject="x", text="   ")
    with pytest.raises(InvalidInput):
        memory_record(tenant=tenant_a, user_id="u", subject="x", text="t", memory_type="nonsense")
    now = timezone.now()
    memory_record(tenant=tenant_a, user_id="u", subject="job", text="Works at Acme", at=now)
    with pytest.raises(Conflict):
        memory_record(
            tenant=tenant_a, user_id="u", subject="job", text="Works at Initech", at=now - timedelta(days=1)
        )
    assert [m.text for m in memories_of(tenant=tenant_a, user_id="u")] == ["Works at Acme"]
