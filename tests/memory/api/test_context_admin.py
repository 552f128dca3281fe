"""The admin: a tenant's context policy and own model profiles, edited inline on the tenant page."""

from __future__ import annotations

import datetime
import json

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from memory.models import ContextPolicy, ModelProfile, default_mode_parts


@pytest.fixture
def admin_client(db: None) -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_admin_edits_policy_and_adds_a_model_the_api_then_uses(admin_client, tenant_a, api_a):
    ContextPolicy.for_tenant(tenant_a)
    url = f"/admin/memory/tenant/{tenant_a.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "context policy" in html.lower() and "model profile" in html.lower()
    # post the whole form back with changes, keeping every other inline as rendered
    context = page.context
    data: dict[str, object] = {
        "name": tenant_a.name,
        "slug": tenant_a.slug,
        "is_active": "on",
        "created_at_0": tenant_a.created_at.strftime("%Y-%m-%d"),
        "created_at_1": tenant_a.created_at.strftime("%H:%M:%S"),
    }
    for formset in context["inline_admin_formsets"]:
        fs = formset.formset
        for key, value in fs.management_form.initial.items():
            data[f"{fs.prefix}-{key}"] = value
        for form in fs.forms:
            for name, field in form.fields.items():
                value = form.initial.get(name, field.initial)
                if value is None:
                    continue
                if isinstance(value, bool):
                    if value:
                        data[f"{form.prefix}-{name}"] = "on"
                    continue
                key = f"{form.prefix}-{name}"
                if isinstance(value, (dict, list)):
                    data[key] = json.dumps(value)
                elif isinstance(value, datetime.datetime):
                    data[f"{key}_0"], data[f"{key}_1"] = (
                        value.strftime("%Y-%m-%d"),
                        value.strftime("%H:%M:%S"),
                    )
                else:
                    data[key] = value.pk if hasattr(value, "pk") else value
    policy_prefix = next(
        f.formset.prefix for f in context["inline_admin_formsets"] if f.formset.model is ContextPolicy
    )
    profile_prefix = next(
        f.formset.prefix for f in context["inline_admin_formsets"] if f.formset.model is ModelProfile
    )
    data[f"{policy_prefix}-0-history_window"] = 12
    data[f"{profile_prefix}-TOTAL_FORMS"] = 1
    data.update(
        {
            f"{profile_prefix}-0-name": "acme-llm",
            f"{profile_prefix}-0-provider": "acme",
            f"{profile_prefix}-0-input_limit": 9000,
            f"{profile_prefix}-0-output_limit": 1000,
            f"{profile_prefix}-0-tokenizer": "cl100k_base",
            f"{profile_prefix}-0-notes": "",
        }
    )
    response = admin_client.post(url, data)
    if response.status_code != 302:
        errs = [
            (f.formset.prefix, f.formset.errors, f.formset.non_form_errors())
            for f in response.context["inline_admin_formsets"]
        ]
        raise AssertionError((response.context["adminform"].form.errors, errs))
    policy = ContextPolicy.objects.get(tenant=tenant_a)
    assert policy.history_window == 12 and policy.mode_parts == default_mode_parts()
    profile = ModelProfile.objects.get(tenant=tenant_a, name="acme-llm")
    assert (profile.input_limit, profile.tokenizer) == (9000, "cl100k_base")
    models = {m["name"]: m for m in api_a.get("/api/v1/models").json()["models"]}
    assert models["acme-llm"]["source"] == "tenant" and models["acme-llm"]["input_limit"] == 9000
