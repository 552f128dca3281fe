"""POST /api/v1/tokens/count."""

from __future__ import annotations

import pytest

from memory.models import ModelProfile
from memory.services import tokens

URL = "/api/v1/tokens/count"


@pytest.mark.django_db
def test_it_counts_text_exactly_for_openai_models(api_a):
    response = api_a.post(URL, {"text": "Hello, world! How are you?", "model": "gpt-4o"}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert body["tokens"] == tokens.count_tokens("Hello, world! How are you?")
    assert (body["exact"], body["tokenizer"], body["model_known"]) == (True, "o200k_base", True)
    cl = api_a.post(URL, {"text": "Hello, world!", "model": "gpt-3.5-turbo"}, format="json").json()
    assert cl["tokenizer"] == "cl100k_base"
    assert cl["tokens"] == tokens.count_tokens("Hello, world!", encoding_name="cl100k_base")


@pytest.mark.django_db
def test_it_counts_messages_the_way_builds_count_them(api_a):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f"}}]
    body = api_a.post(URL, {"messages": messages, "tools": tools, "model": "gpt-4.1"}, format="json").json()
    assert body["tokens"] == tokens.TokenCounter("o200k_base").prompt_tokens(messages, tools)
    assert "3 reply priming" in body["counting"]


@pytest.mark.django_db
def test_it_estimates_for_other_models_and_warns_for_unknown_ones(api_a, make_client, tenant_a):
    body = api_a.post(URL, {"text": "这是一个测试。", "model": "claude-sonnet-4"}, format="json").json()
    assert body["exact"] is False and body["tokenizer"] == "estimate:anthropic"
    assert body["content_type"] == "cjk" and body["tokens"] >= 1 and body["warnings"] == []
    unknown = api_a.post(URL, {"text": "hello", "model": "who-knows"}, format="json").json()
    assert unknown["model_known"] is False and unknown["warnings"][0]["code"] == "unknown_model"
    # a tenant's own model with an exact tokenizer; a read-only key may count
    ModelProfile.objects.create(
        tenant=tenant_a, name="acme", input_limit=9000, output_limit=100, tokenizer="cl100k_base"
    )
    reader = make_client(tenant_a, ["read"])
    own = reader.post(URL, {"text": "hello", "model": "acme"}, format="json")
    assert own.status_code == 200 and own.json()["tokenizer"] == "cl100k_base"


@pytest.mark.django_db
def test_bad_input_names_the_field(api_a, anon):
    both = api_a.post(URL, {"text": "a", "messages": [{"role": "user", "content": "a"}]}, format="json")
    assert both.status_code == 422 and "text" in both.json()["error"]["details"]["fields"]
    role = api_a.post(URL, {"messages": [{"role": "robot", "content": "a"}]}, format="json")
    assert role.status_code == 422 and "messages" in role.json()["error"]["details"]["fields"]
    assert anon.post(URL, {"text": "a"}, format="json").status_code == 401


@pytest.mark.django_db
def test_another_tenants_model_is_not_used(api_b, tenant_a):
    ModelProfile.objects.create(
        tenant=tenant_a, name="alice-secret", input_limit=9000, output_limit=100, tokenizer="cl100k_base"
    )
    body = api_b.post(URL, {"text": "hello", "model": "alice-secret"}, format="json").json()
    assert body["model_known"] is False and body["tokenizer"] == "estimate:generic"
