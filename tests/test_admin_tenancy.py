"""Django admin for tenants, API keys and members, driven through the real admin views as a superuser."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from memory.models import ApiKey, Event, Membership, Tenant, hash_secret

pytestmark = pytest.mark.django_db

SECRET = re.compile(r"ctx_[0-9a-f]{8}_[A-Za-z0-9_-]{32}")


def api_client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_creating_a_key_in_the_admin_shows_the_secret_once(admin_client: Any, tenant_a: Tenant) -> None:
    response = admin_client.post(
        "/admin/memory/apikey/add/",
        {
            "tenant": tenant_a.pk,
            "name": "deploy bot",
            "scopes": ["read"],
            "expires_at_0": "",
            "expires_at_1": "",
        },
        follow=True,
    )
    assert response.status_code == 200
    shown = SECRET.findall(response.content.decode())
    assert len(shown) == 1, response.content.decode()
    secret = shown[0]
    key = ApiKey.objects.get(tenant=tenant_a, name="deploy bot")
    assert secret.startswith(f"ctx_{key.prefix}_")
    assert key.secret_hash == hash_secret(secret) and secret not in key.secret_hash
    assert key.scopes == ["read"]
    # The key works, with its scope.
    assert api_client(secret).get("/api/v1/tenant").json() == {
        "slug": tenant_a.slug,
        "name": tenant_a.name,
        "key_prefix": key.prefix,
        "scopes": ["read"],
    }
    # Shown once: neither the list nor the key's page shows it again.
    for page in ("/admin/memory/apikey/", f"/admin/memory/apikey/{key.pk}/change/"):
        body = admin_client.get(page).content.decode()
        assert secret not in body
        assert f"ctx_{key.prefix}_" in body
    event = Event.objects.get(tenant=tenant_a, type="api_key.created")
    assert event.payload == {
        "key_prefix": key.prefix,
        "name": "deploy bot",
        "scopes": ["read"],
        "actor": "admin user admin",
    }


def test_an_invalid_key_form_creates_nothing(admin_client: Any) -> None:
    response = admin_client.post("/admin/memory/apikey/add/", {"name": "no tenant", "scopes": ["root"]})
    assert response.status_code == 200  # the form again, with its errors
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"tenant", "scopes"}
    assert not ApiKey.objects.exists()
    assert not SECRET.search(response.content.decode())


def test_the_revoke_action_revokes_the_selected_keys(admin_client: Any, api_a: Any, api_b: Any) -> None:
    response = admin_client.post(
        "/admin/memory/apikey/",
        {"action": "revoke", "_selected_action": [api_a.api_key.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Revoked 1 key(s)" in response.content.decode()
    assert ApiKey.objects.get(pk=api_a.api_key.pk).revoked_at is not None
    assert api_a.get("/api/v1/tenant").status_code == 401
    assert api_b.get("/api/v1/tenant").status_code == 200  # Bob's key was not selected
    assert ApiKey.objects.get(pk=api_b.api_key.pk).revoked_at is None
    assert Event.objects.filter(type="api_key.revoked").count() == 1
    # Revoking again is harmless and records nothing more.
    admin_client.post("/admin/memory/apikey/", {"action": "revoke", "_selected_action": [api_a.api_key.pk]})
    assert Event.objects.filter(type="api_key.revoked").count() == 1
    changelist = admin_client.get("/admin/memory/apikey/").content.decode()
    assert "revoked" in changelist and "active" in changelist


def test_a_keys_tenant_cannot_be_changed(admin_client: Any, api_a: Any, tenant_b: Tenant) -> None:
    key = api_a.api_key
    admin_client.post(
        f"/admin/memory/apikey/{key.pk}/change/",
        {
            "tenant": tenant_b.pk,
            "name": "renamed",
            "scopes": ["read", "write"],
            "expires_at_0": "",
            "expires_at_1": "",
        },
    )
    key.refresh_from_db()
    assert key.name == "renamed"
    assert key.tenant_id == api_a.api_key.tenant_id  # still Alice's: moving it would hand over access
    assert api_a.get("/api/v1/tenant").json()["slug"] == "alice"


def test_memberships_are_managed_in_the_admin(admin_client: Any, tenant_a: Tenant, tenant_b: Tenant) -> None:
    carol = get_user_model().objects.create_user("carol", password="pw-carol-123")
    response = admin_client.post(
        "/admin/memory/membership/add/",
        {"user": carol.pk, "tenant": tenant_a.pk, "role": "operator"},
        follow=True,
    )
    assert response.status_code == 200
    membership = Membership.objects.get(user=carol)
    assert (membership.tenant, membership.role) == (tenant_a, "operator")
    # The same user twice in one tenant is refused, and nothing is written.
    again = admin_client.post(
        "/admin/memory/membership/add/", {"user": carol.pk, "tenant": tenant_a.pk, "role": "viewer"}
    )
    assert again.status_code == 200
    assert again.context["adminform"].form.errors
    assert Membership.objects.filter(user=carol).count() == 1
    # A second tenant is fine.
    admin_client.post(
        "/admin/memory/membership/add/", {"user": carol.pk, "tenant": tenant_b.pk, "role": "viewer"}
    )
    assert set(Membership.objects.filter(user=carol).values_list("tenant__slug", "role")) == {
        ("alice", "operator"),
        ("bob", "viewer"),
    }
    listing = admin_client.get(f"/admin/memory/membership/?tenant__id__exact={tenant_a.pk}").content.decode()
    assert "carol" in listing


def test_tenant_pages_render_with_members_keys_and_policies(
    admin_client: Any, api_a: Any, tenant_a: Tenant
) -> None:
    assert admin_client.get("/admin/memory/tenant/add/").status_code == 200
    page = admin_client.get(f"/admin/memory/tenant/{tenant_a.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert api_a.api_key.prefix in body  # the key is listed by its visible prefix …
    assert api_a.secret not in body  # … never by its secret
    assert "membership" in body.lower()


def test_creating_a_tenant_in_the_admin(admin_client: Any) -> None:
    response = admin_client.post(
        "/admin/memory/tenant/add/",
        {
            "name": "Dana's lab",
            "slug": "dana",
            "is_active": "on",
            **_empty_inline_management_forms(admin_client),
        },
        follow=True,
    )
    assert response.status_code == 200
    assert Tenant.objects.filter(slug="dana", name="Dana's lab").exists(), response.content.decode()[:2000]


def _empty_inline_management_forms(admin_client: Any) -> dict[str, str]:
    """The management form fields of every inline on the tenant page, with no rows."""
    page = admin_client.get("/admin/memory/tenant/add/").content.decode()
    data: dict[str, str] = {}
    for name, value in re.findall(
        r'name="([^"]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"[^>]*value="(\d*)"', page
    ):
        data[name] = "0" if name.endswith(("TOTAL_FORMS", "INITIAL_FORMS")) else value
    return data


def test_add_forms_show_no_field_that_only_a_saved_row_has(admin_client: Any) -> None:
    from django.apps import apps
    from django.contrib import admin as django_admin

    checked = []
    for model in filter(django_admin.site.is_registered, apps.get_models()):
        opts = model._meta
        url = f"/admin/{opts.app_label}/{opts.model_name}/add/"
        response = admin_client.get(url)
        if response.status_code == 403:  # rows of this kind are made by the service, not by hand
            continue
        assert response.status_code == 200, url
        body = response.content.decode()
        for label in ("Created at", "Updated at", "Last used at", "Revoked at"):
            assert f">{label}:<" not in body and f">{label}<" not in body, (url, label)
        checked.append(url)
    assert "/admin/memory/apikey/add/" in checked and "/admin/memory/tenant/add/" in checked


def test_key_scopes_read_as_words_in_lists_and_on_the_tenant(admin_client: Any, tenant_a: Tenant) -> None:
    from memory.services.tenancy import api_key_create

    api_key_create(tenant=tenant_a, name="reader", scopes=["read"])
    api_key_create(tenant=tenant_a, name="default", scopes=[])
    for page in ("/admin/memory/apikey/", f"/admin/memory/tenant/{tenant_a.pk}/change/"):
        body = admin_client.get(page).content.decode()
        assert "read, write (default)" in body and "[&quot;read&quot;]" not in body, page
        assert "[]" not in body.replace("[]=", ""), page
