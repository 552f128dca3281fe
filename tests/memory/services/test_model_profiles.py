"""The model table, tenant overrides, unknown models and the usage correction."""

from __future__ import annotations

import pytest

from memory.models import BudgetSample, ModelProfile, TokenUsageReport
from memory.services import model_profiles
from memory.services.sessions import session_create


def test_the_table_covers_sixty_current_models_of_every_major_provider():
    table = model_profiles.builtin_table()
    assert len(table["models"]) >= 60 and table["as_of"] and table["source"]
    providers = {m["provider"] for m in table["models"]}
    assert {
        "openai",
        "anthropic",
        "google",
        "meta",
        "mistral",
        "qwen",
        "deepseek",
        "xai",
        "cohere",
    } <= providers
    for row in table["models"]:
        assert row["input_limit"] >= 8192 and 0 < row["output_limit"] <= row["input_limit"], row["name"]
        assert row["tokenizer"] in {"o200k_base", "cl100k_base"} or row["tokenizer"].startswith("estimate:")
    names = [m["name"] for m in table["models"]]
    assert len(names) == len(set(names))


@pytest.mark.django_db
def test_resolution_by_name_alias_snapshot_and_provider_prefix(tenant_a):
    resolve = model_profiles.model_profile_resolve
    assert resolve(tenant=tenant_a, name="gpt-4o").tokenizer == "o200k_base"
    assert resolve(tenant=tenant_a, name="gpt-4").tokenizer == "cl100k_base"
    snapshot = resolve(tenant=tenant_a, name="gpt-4o-2024-08-06")
    assert snapshot.profile == "gpt-4o" and snapshot.input_limit == 128000
    dated = resolve(tenant=tenant_a, name="claude-sonnet-4-20250514")
    assert dated.profile == "claude-sonnet-4" and dated.tokenizer == "estimate:anthropic"
    assert resolve(tenant=tenant_a, name="openai/gpt-4.1-mini").profile == "gpt-4.1-mini"
    assert resolve(tenant=tenant_a, name="mistral-large-latest").profile == "mistral-large-2411"
    unknown = resolve(tenant=tenant_a, name="nobody-knows-7b")
    assert (unknown.known, unknown.input_limit, unknown.tokenizer) == (False, 64000, "estimate:generic")


@pytest.mark.django_db
def test_tenant_profiles_override_builtins_for_that_tenant_only(tenant_a, tenant_b):
    ModelProfile.objects.create(
        tenant=tenant_a, name="gpt-4o", input_limit=32000, output_limit=1000, tokenizer="o200k_base"
    )
    ModelProfile.objects.create(tenant=tenant_a, name="acme-ft", input_limit=8000, output_limit=500)
    assert model_profiles.model_profile_resolve(tenant=tenant_a, name="gpt-4o").input_limit == 32000
    assert model_profiles.model_profile_resolve(tenant=tenant_b, name="gpt-4o").input_limit == 128000
    listed = {m.name: m for m in model_profiles.model_profiles_list(tenant=tenant_a)}
    assert listed["gpt-4o"].source == "tenant" and listed["acme-ft"].source == "tenant"
    assert "acme-ft" not in {m.name for m in model_profiles.model_profiles_list(tenant=tenant_b)}


@pytest.mark.django_db
def test_usage_correction_needs_three_reports_uses_the_median_and_is_bounded(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    sample = BudgetSample.objects.create(
        tenant=tenant_a,
        session=session,
        model_name="claude-sonnet-4",
        tokenizer="estimate:anthropic",
        exact=False,
        prompt_tokens=100,
        demand_tokens=100,
        input_limit=200000,
        output_reserve=4096,
        threshold_tokens=170000,
        utilisation=0.0,
    )

    def report(actual: int) -> None:
        TokenUsageReport.objects.create(
            tenant=tenant_a,
            session=session,
            budget_sample=sample,
            model_name="claude-sonnet-4",
            tokenizer="estimate:anthropic",
            estimated_input_tokens=100,
            input_tokens=actual,
        )

    report(120)
    report(125)
    assert model_profiles.usage_correction(tenant=tenant_a, model_name="claude-sonnet-4") == (1.0, 2)
    report(900)  # an outlier does not move the median far
    assert model_profiles.usage_correction(tenant=tenant_a, model_name="claude-sonnet-4") == (1.25, 3)
    for _ in range(4):
        report(900)
    assert model_profiles.usage_correction(tenant=tenant_a, model_name="claude-sonnet-4") == (
        2.0,
        7,
    )  # clamped
    model = model_profiles.model_profile_resolve(tenant=tenant_a, name="claude-sonnet-4")
    assert model_profiles.counter_for(tenant=tenant_a, model=model).factor == 2.0
