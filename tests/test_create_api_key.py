"""`create_api_key --expires-in-days`: 0 or less is refused rather than read as "never expires"."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from memory.models import ApiKey, Tenant


@pytest.mark.django_db
@pytest.mark.parametrize("days", ["0", "-3"])
def test_non_positive_expiry_is_refused(days: str) -> None:
    Tenant.objects.create(name="Alice's team", slug="alice")
    with pytest.raises(CommandError, match="--expires-in-days must be 1 or more") as raised:
        call_command("create_api_key", "--tenant", "alice", "--expires-in-days", days, stdout=StringIO())
    assert raised.value.returncode == 2
    assert not ApiKey.objects.exists()


@pytest.mark.django_db
def test_one_day_expiry_is_set() -> None:
    Tenant.objects.create(name="Alice's team", slug="alice")
    call_command("create_api_key", "--tenant", "alice", "--expires-in-days", "1", stdout=StringIO())
    assert ApiKey.objects.get().expires_at is not None
