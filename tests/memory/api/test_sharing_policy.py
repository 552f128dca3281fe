"""GET / PATCH /api/v1/tenant/policies/sharing: admin scope, unknown fields and non-booleans refused."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenant/policies/sharing"
NOTHING_SHARED = {
    "share_digests": False,
    "share_messages": False,
    "share_experiences": False,
    "share_user_memories": False,
}


def test_an_admin_key_reads_and_changes_the_policy(make_client, tenant_a, tenant_b):
    admin = make_client(tenant_a, ["admin"])
    assert admin.get(URL).json() == NOTHING_SHARED
    response = admin.patch(URL, {"share_experiences": True}, format="json")
    assert response.status_code == 200 and response.json() == {**NOTHING_SHARED, "share_experiences": True}
    assert admin.get(URL).json()["share_experiences"] is True
    # Another tenant's policy is its own.
    assert make_client(tenant_b, ["admin"]).get(URL).json() == NOTHING_SHARED


@pytest.mark.parametrize(
    ("body", "field"),
    [({"share_everything": True}, "share_everything"), ({"share_messages": "yes"}, "share_messages")],
)
def test_a_bad_change_answers_422_naming_the_field_and_writes_nothing(make_client, tenant_a, body, field):
    admin = make_client(tenant_a, ["admin"])
    response = admin.patch(URL, {**body, "share_digests": True}, format="json")
    assert response.status_code == 422
    assert field in response.json()["error"]["details"]["fields"]
    assert admin.get(URL).json() == NOTHING_SHARED


def test_a_read_write_key_may_not_read_or_change_it(api_a):
    assert api_a.get(URL).status_code == 403
    assert api_a.patch(URL, {"share_messages": True}, format="json").status_code == 403
