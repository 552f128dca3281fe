"""The Python client's context-engine methods, through the real Django app in-process (WSGI)."""

from __future__ import annotations

import pytest

from ctxapp import client as ctx
from memory.models import BudgetSample, TokenUsageReport
from memory.services.sessions import MessageInput, messages_append, session_create


@pytest.mark.django_db
def test_client_builds_reports_usage_and_counts(alice, tenant_a, tenant_b):
    session = session_create(tenant=tenant_a, agent_external_id="bot", model_name="gpt-4o")
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="hello")])
    built = alice.context_build(
        session.public_id, "next?", system_parts={"core": "Be brief."}, budget={"history_window": 5}
    )
    assert built["messages"][0] == {"role": "system", "content": "Be brief."}
    assert built["messages"][-1] == {"role": "user", "content": "next?"}
    assert BudgetSample.objects.filter(public_id=built["build_id"]).exists()
    assert alice.context_builds(session.public_id)[0]["build_id"] == built["build_id"]
    report = alice.usage_report(
        session.public_id, input_tokens=built["budget"]["prompt_tokens"] + 2, cached_input_tokens=0
    )
    assert report["build_id"] == built["build_id"] and TokenUsageReport.objects.count() == 1
    counted = alice.tokens_count(messages=built["messages"], model="gpt-4o")
    assert counted["tokens"] == built["manifest"]["total_tokens"]
    assert any(m["name"] == "gpt-4o" for m in alice.models_list(provider="openai"))
    assert (
        alice.context_policy_set(session.public_id, {"history_window": 7})["effective"]["history_window"] == 7
    )
    assert alice.summaries_list(session.public_id) == []
    with pytest.raises(ctx.PromptTooLong) as info:
        alice.context_build(session.public_id, "x" * 9000)
    assert info.value.details["char_gate"] == 8192
    foreign = session_create(tenant=tenant_b, agent_external_id="bob-bot")
    with pytest.raises(ctx.NotFound):
        alice.context_build(foreign.public_id, "hi")
