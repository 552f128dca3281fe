"""User memories in the Django admin: listed per tenant, read-only, erased only through the service."""

from __future__ import annotations

from typing import Any

import pytest

from memory.models import Event, Tenant, UserMemory
from memory.services.user_memory.store import memory_record

pytestmark = pytest.mark.django_db


def test_memories_are_listed_by_tenant_read_only_and_erased_with_their_versions(
    admin_client: Any, tenant_a: Tenant, tenant_b: Tenant
) -> None:
    old = memory_record(tenant=tenant_a, user_id="u-1", subject="home", text="Lives in Porto").memory
    new = memory_record(tenant=tenant_a, user_id="u-1", subject="home", text="Moved to Lisbon").memory
    memory_record(tenant=tenant_b, user_id="u-9", subject="pet", text="Has a cat named Tofu")

    page = admin_client.get("/admin/memory/usermemory/", {"tenant__id__exact": tenant_a.pk}).content.decode()
    assert old.public_id in page and new.public_id in page and "u-9" not in page
    detail = admin_client.get(f"/admin/memory/usermemory/{new.pk}/change/")
    assert detail.status_code == 200 and "Moved to Lisbon" in detail.content.decode()
    edited = admin_client.post(f"/admin/memory/usermemory/{new.pk}/change/", {"text": "Moved to Faro"})
    assert edited.status_code == 403
    assert admin_client.post(f"/admin/memory/usermemory/{new.pk}/delete/", {"post": "yes"}).status_code == 403

    erased = admin_client.post(
        "/admin/memory/usermemory/", {"action": "erase", "_selected_action": [new.pk]}, follow=True
    )
    assert erased.status_code == 200 and "Erased 2 memories." in erased.content.decode()
    assert list(UserMemory.objects.values_list("user_id", flat=True)) == ["u-9"]
    assert Event.objects.filter(tenant=tenant_a, type="user_memory.deleted").count() == 1
