"""GET /api/v1/models and /api/v1/models/{name}."""

from __future__ import annotations

import pytest

from memory.models import ModelProfile


@pytest.mark.django_db
def test_it_lists_builtin_and_own_models(api_a, tenant_a):
    ModelProfile.objects.create(
        tenant=tenant_a,
        name="claude-sonnet-4",
        provider="anthropic",
        input_limit=100000,
        output_limit=8000,
        tokenizer="estimate:anthropic",
    )
    ModelProfile.objects.create(tenant=tenant_a, name="acme-ft", input_limit=8000, output_limit=500)
    response = api_a.get("/api/v1/models")
    assert response.status_code == 200
    body = response.json()
    models = {m["name"]: m for m in body["models"]}
    assert len(models) >= 61 and body["unknown_model_input_limit"] == 64000 and body["as_of"]
    assert (
        models["claude-sonnet-4"]["input_limit"] == 100000 and models["claude-sonnet-4"]["source"] == "tenant"
    )
    assert models["acme-ft"]["source"] == "tenant"
    assert models["gpt-4o"] == {
        "name": "gpt-4o",
        "provider": "openai",
        "input_limit": 128000,
        "output_limit": 16384,
        "tokenizer": "o200k_base",
        "exact": True,
        "source": "builtin",
        "aliases": [],
    }
    openai_only = api_a.get("/api/v1/models", {"provider": "openai"}).json()["models"]
    assert openai_only and {m["provider"] for m in openai_only} == {"openai"}


@pytest.mark.django_db
def test_one_model_with_its_calibration(api_a):
    body = api_a.get("/api/v1/models/claude-sonnet-4-20250514").json()
    assert body["matched_profile"] == "claude-sonnet-4" and body["usage_calibration"] == {
        "reports": 0,
        "factor": 1.0,
        "applied": False,
    }
    missing = api_a.get("/api/v1/models/nothing-like-this")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


@pytest.mark.django_db
def test_another_tenants_models_are_invisible(api_a, api_b, tenant_a):
    ModelProfile.objects.create(tenant=tenant_a, name="alice-ft", input_limit=8000, output_limit=500)
    assert "alice-ft" not in {m["name"] for m in api_b.get("/api/v1/models").json()["models"]}
    assert api_b.get("/api/v1/models/alice-ft").status_code == 404
    assert api_a.get("/api/v1/models/alice-ft").status_code == 200
