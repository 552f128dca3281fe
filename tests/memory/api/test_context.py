"""/api/v1/sessions/{id}/context, /usage, /context-policy, /summaries."""

from __future__ import annotations

import pytest

from memory.models import BudgetSample, Event, ModelProfile, SessionContextPolicy, Summary, TokenUsageReport
from memory.services import tokens
from memory.services.sessions import MessageInput, messages_append, session_create


def _session(tenant, model="gpt-4o", metadata=None, n=0):
    session = session_create(tenant=tenant, agent_external_id="bot", model_name=model, metadata=metadata)
    if n:
        messages_append(
            tenant=tenant,
            session=session,
            items=[
                MessageInput(
                    role="user" if i % 2 == 0 else "assistant", content=f"message {i} " + "text " * 10
                )
                for i in range(n)
            ],
        )
    return session


def _url(session, tail="context"):
    return f"/api/v1/sessions/{session.public_id}/{tail}"


@pytest.mark.django_db
def test_build_returns_messages_manifest_budget_and_records_the_sample(api_a, tenant_a):
    session = _session(tenant_a, n=6)
    response = api_a.post(
        _url(session),
        {
            "input": "What now?",
            "system_parts": {"core": "You are helpful.", "style": "Be brief."},
            "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
            "open_questions": ["Which region?"],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["messages"][0] == {"role": "system", "content": "You are helpful."}
    assert body["messages"][-1] == {"role": "user", "content": "What now?"}
    counter = tokens.TokenCounter("o200k_base")
    assert body["manifest"]["total_tokens"] == counter.prompt_tokens(body["messages"], body["tools"])
    assert set(body["budget"]["components"]) == {
        "system",
        "tools",
        "user_profile",
        "pinned_facts",
        "memories",
        "recall",
        "summary",
        "history",
        "open_questions",
        "input",
        "overhead",
    }
    assert body["budget"]["utilisation"] == round(body["budget"]["prompt_tokens"] / 128000, 4)
    assert body["summarisation"]["queued"] is False
    assert set(body["forecast"]) == {
        "growth_tokens_per_turn",
        "basis",
        "turns_until_summarisation",
        "turns_until_window",
    }
    kinds = [(i["kind"], i["included"]) for i in body["manifest"]["items"]]
    assert kinds.count(("history", True)) == 6
    sample = BudgetSample.objects.get(public_id=body["build_id"])
    assert sample.session_id == session.pk and sample.manifest == body["manifest"]
    assert Event.objects.filter(type="context.built", session=session).count() == 1
    listed = api_a.get(_url(session)).json()["builds"]
    assert [b["build_id"] for b in listed] == [body["build_id"]]


@pytest.mark.django_db
def test_prompt_too_long_is_422_with_the_numbers_and_records_nothing(api_a, tenant_a):
    ModelProfile.objects.create(
        tenant=tenant_a, name="tiny", input_limit=300, output_limit=100, tokenizer="o200k_base"
    )
    session = _session(tenant_a, model="tiny")
    response = api_a.post(_url(session), {"input": "word " * 500}, format="json")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "prompt_too_long"
    assert error["details"]["budget_tokens"] == 200 and error["details"]["minimal_tokens"] > 200
    chars = api_a.post(_url(session), {"input": "é" * 9000}, format="json").json()["error"]
    assert chars["code"] == "prompt_too_long" and chars["details"]["input_chars"] == 9000
    surrogate = api_a.post(_url(session), '{"input": "a\\ud800"}', content_type="application/json")
    assert surrogate.status_code == 422 and "input" in surrogate.json()["error"]["details"]["fields"]
    nul = api_a.post(_url(session), {"input": "a\x00"}, format="json")
    assert nul.status_code == 422 and "input" in nul.json()["error"]["details"]["fields"]
    assert not BudgetSample.objects.exists() and not Event.objects.filter(type="context.built").exists()


@pytest.mark.django_db
def test_budget_overrides_and_session_policy(api_a, tenant_a):
    session = _session(tenant_a, n=12, metadata={"context_policy": {"history_window": 4}})
    body = api_a.post(_url(session), {"input": "hi"}, format="json").json()
    assert sum(1 for i in body["manifest"]["items"] if i["kind"] == "history" and i["included"]) == 4
    put = api_a.put(
        _url(session, "context-policy"),
        {"overrides": {"history_window": 2, "output_reserve": 1000}},
        format="json",
    )
    assert put.status_code == 200 and put.json()["effective"]["history_window"] == 2
    assert SessionContextPolicy.objects.get(session=session).overrides == {
        "history_window": 2,
        "output_reserve": 1000,
    }
    assert Event.objects.filter(type="context.policy_changed").count() == 1
    body = api_a.post(_url(session), {"input": "hi", "budget": {"history_window": 3}}, format="json").json()
    assert sum(1 for i in body["manifest"]["items"] if i["kind"] == "history" and i["included"]) == 3
    assert body["budget"]["output_reserve"] == 1000
    bad = api_a.post(_url(session), {"input": "hi", "budget": {"history_window": -1}}, format="json")
    assert bad.status_code == 422 and "budget.history_window" in bad.json()["error"]["details"]["fields"]
    unknown = api_a.put(_url(session, "context-policy"), {"overrides": {"colour": "red"}}, format="json")
    assert unknown.status_code == 422 and "overrides.colour" in unknown.json()["error"]["details"]["fields"]
    assert SessionContextPolicy.objects.get(session=session).overrides["history_window"] == 2


@pytest.mark.django_db
def test_usage_reports_correct_later_estimates(api_a, tenant_a):
    session = _session(tenant_a, model="claude-sonnet-4", n=4)
    first = api_a.post(_url(session), {"input": "hi"}, format="json").json()
    assert first["budget"]["exact"] is False and first["budget"]["estimate_factor"] == 1.0
    estimated = first["budget"]["prompt_tokens"]
    for _ in range(3):
        response = api_a.post(
            _url(session, "usage"),
            {
                "build_id": first["build_id"],
                "gen_ai.usage.input_tokens": int(estimated * 1.2),
                "gen_ai.usage.output_tokens": 50,
                "gen_ai.usage.cache_read.input_tokens": 10,
                "gen_ai.usage.reasoning.output_tokens": 7,
            },
            format="json",
        )
        assert response.status_code == 201, response.content
    body = response.json()
    assert body["estimated_input_tokens"] == estimated and body["calibration"]["reports"] == 3
    report = TokenUsageReport.objects.filter(session=session).first()
    assert (
        report.input_tokens,
        report.cached_input_tokens,
        report.reasoning_tokens,
        report.output_tokens,
    ) == (int(estimated * 1.2), 10, 7, 50)
    assert Event.objects.filter(type="usage.reported").count() == 3
    second = api_a.post(_url(session), {"input": "hi"}, format="json").json()
    assert second["budget"]["estimate_factor"] == pytest.approx(int(estimated * 1.2) / estimated, abs=1e-9)
    assert second["budget"]["prompt_tokens"] > estimated
    assert second["manifest"]["usage_correction"]["reports"] == 3
    # OpenAI's own usage object is accepted too; latest build by default
    openai_style = api_a.post(
        _url(session, "usage"),
        {
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 64},
                "completion_tokens_details": {"reasoning_tokens": 5},
            }
        },
        format="json",
    )
    assert openai_style.status_code == 201 and openai_style.json()["build_id"] == second["build_id"]
    assert openai_style.json()["gen_ai.usage.cache_read.input_tokens"] == 64
    missing = api_a.post(_url(session, "usage"), {"gen_ai.usage.output_tokens": 5}, format="json")
    assert (
        missing.status_code == 422
        and "gen_ai.usage.input_tokens" in missing.json()["error"]["details"]["fields"]
    )
    cached_too_big = api_a.post(
        _url(session, "usage"),
        {"gen_ai.usage.input_tokens": 5, "gen_ai.usage.cache_read.input_tokens": 9},
        format="json",
    )
    assert cached_too_big.status_code == 422
    assert (
        api_a.post(
            _url(session, "usage"), {"build_id": "ctx_nope", "gen_ai.usage.input_tokens": 5}, format="json"
        ).status_code
        == 404
    )
    assert TokenUsageReport.objects.count() == 4


@pytest.mark.django_db
def test_summaries_list_and_summarise_now(api_a, tenant_a, django_capture_on_commit_callbacks):
    session = _session(tenant_a, n=12)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api_a.post(_url(session, "summaries"), format="json")
    assert response.status_code == 202 and len(callbacks) == 1
    from memory.tasks.context import session_summarise

    session_summarise(session.pk)  # what the queued job runs
    summaries = api_a.get(_url(session, "summaries")).json()["summaries"]
    assert len(summaries) == 1 and summaries[0]["is_current"] and summaries[0]["covers_up_to_seq"] == 7
    built = api_a.post(_url(session), {"input": "next"}, format="json").json()
    assert built["messages"][0]["content"].startswith("Summary of the conversation so far (messages 1-7)")


@pytest.mark.django_db
def test_another_tenants_session_is_404_everywhere_and_nothing_changes(api_a, api_b, tenant_a):
    session = _session(tenant_a, n=4)
    api_a.post(_url(session), {"input": "hi"}, format="json")
    before = (
        BudgetSample.objects.count(),
        Event.objects.count(),
        Summary.objects.count(),
        TokenUsageReport.objects.count(),
    )
    calls = [
        api_b.post(_url(session), {"input": "hi"}, format="json"),
        api_b.get(_url(session)),
        api_b.post(_url(session, "usage"), {"gen_ai.usage.input_tokens": 5}, format="json"),
        api_b.get(_url(session, "context-policy")),
        api_b.put(_url(session, "context-policy"), {"overrides": {"history_window": 2}}, format="json"),
        api_b.get(_url(session, "summaries")),
        api_b.post(_url(session, "summaries"), format="json"),
    ]
    for response in calls:
        assert response.status_code == 404, response.content
        assert response.json()["error"] == {
            "code": "not_found",
            "message": f"No session with id {session.public_id!r}.",
            "details": {"kind": "session", "id": session.public_id},
        }
    assert (
        BudgetSample.objects.count(),
        Event.objects.count(),
        Summary.objects.count(),
        TokenUsageReport.objects.count(),
    ) == before
    assert not SessionContextPolicy.objects.exists()
    assert api_a.get("/api/v1/sessions/sess_000000000000000000000000/context").status_code == 404


@pytest.mark.django_db
def test_a_prompt_too_long_error_names_the_policy_field_that_moves_the_gate(api_a, tenant_a):
    session = _session(tenant_a, model="gpt-4o")  # a 128k-token model: only the character gate refuses
    refused = api_a.post(_url(session), {"input": "word " * 4400}, format="json")
    assert refused.status_code == 422, refused.content
    error = refused.json()["error"]
    assert error["code"] == "prompt_too_long" and error["details"]["policy_field"] == "char_gate"
    assert "char_gate" in error["message"] and "context-policy" in error["message"], error["message"]
    # The field it names does move the gate.
    built = api_a.post(_url(session), {"input": "word " * 4400, "budget": {"char_gate": 0}}, format="json")
    assert built.status_code == 200, built.content


@pytest.mark.django_db
def test_a_build_without_a_model_says_none_was_set_and_what_it_assumed(api_a, tenant_a, settings):
    session = _session(tenant_a, model="")
    built = api_a.post(_url(session), {"input": "hello"}, format="json")
    assert built.status_code == 200, built.content
    warning = next(w for w in built.json()["warnings"] if w["code"] == "unknown_model")
    assert warning["message"].startswith("No model was set"), warning
    assert f"{settings.CTXAPP.unknown_model_input_tokens:,} input tokens" in warning["message"]
    assert "(none)" not in warning["message"] and "not in the profile table" not in warning["message"]
