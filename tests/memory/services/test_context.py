"""The context builder: placement, fitting, gates, manifest arithmetic, samples and events."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory.exceptions import InvalidInput, PromptTooLong
from memory.models import BudgetSample, Event, ModelProfile
from memory.services import decay, tokens
from memory.services import experience_search as retrieval
from memory.services.context import SystemPart, context_build
from memory.services.sessions import MessageInput, messages_append, session_create

O200K = tokens.TokenCounter("o200k_base")


def _session(tenant, model="gpt-4o"):
    return session_create(tenant=tenant, agent_external_id="bot", model_name=model)


def _append(tenant, session, *items):
    return messages_append(tenant=tenant, session=session, items=list(items))


def _tiny_model(tenant, input_limit=1200, output_limit=200, name="tiny"):
    return ModelProfile.objects.create(
        tenant=tenant, name=name, input_limit=input_limit, output_limit=output_limit, tokenizer="o200k_base"
    )


def _tool_pair(call_id: str, result: str) -> list[MessageInput]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": "search", "arguments": json.dumps({"q": call_id})},
    }
    return [
        MessageInput(role="assistant", content="", tool_calls=[call]),
        MessageInput(role="tool", content=result, tool_call_id=call_id),
    ]


@pytest.mark.django_db
def test_it_places_parts_in_u_shape_order_and_counts_exactly(tenant_a):
    session = _session(tenant_a)
    _append(
        tenant_a,
        session,
        MessageInput(role="user", content="We use PostgreSQL 16."),
        MessageInput(role="assistant", content="Noted."),
    )
    built = context_build(
        tenant=tenant_a,
        session=session,
        next_input="What database do we use?",
        system_parts=[SystemPart("core", "You are a careful assistant."), SystemPart("style", "Be brief.")],
        open_questions=["Which region?"],
        next_actions=["Check backups"],
        tools=[{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
    )
    roles = [m["role"] for m in built.messages]
    contents = [m["content"] for m in built.messages]
    assert roles == ["system", "system", "user", "assistant", "system", "user"]
    assert contents[0] == "You are a careful assistant."
    assert contents[-2].startswith("Open questions:\n- Which region?")
    assert contents[-1] == "What database do we use?"
    # the manifest's total is the exact count of the prompt returned
    assert built.manifest["total_tokens"] == O200K.prompt_tokens(built.messages, built.tools)
    assert built.budget["prompt_tokens"] == sum(built.budget["components"].values())
    assert built.budget["components"]["tools"] == O200K.tools_tokens(built.tools) > 0
    assert built.budget["utilisation"] == round(built.manifest["total_tokens"] / 128000, 4)
    assert built.budget["output_reserve"] == 4096
    sample = BudgetSample.objects.get(public_id=built.build_id)
    assert sample.prompt_tokens == built.manifest["total_tokens"]
    assert sample.manifest["items"][0]["kind"] == "tools"
    event = Event.objects.get(type="context.built")
    assert event.payload["build_id"] == built.build_id
    assert event.payload["gen_ai.request.model"] == "gpt-4o"
    assert event.payload["prompt_tokens"] == sample.prompt_tokens


@pytest.mark.django_db
def test_it_uses_only_the_window_and_never_splits_a_tool_call(tenant_a):
    session = _session(tenant_a)
    items = []
    for i in range(20):
        items.append(MessageInput(role="user", content=f"question {i}"))
        items.extend(_tool_pair(f"call_{i}", f"result {i}"))
    _append(tenant_a, session, *items)
    built = context_build(
        tenant=tenant_a, session=session, next_input="next", overrides={"history_window": 10}
    )
    history = [i for i in built.manifest["items"] if i["kind"] == "history" and i["included"]]
    assert len(history) <= 10
    # every tool result sent has its call right before it in the prompt, and vice versa
    sent_calls = {c["id"] for m in built.messages for c in m.get("tool_calls", [])}
    sent_results = {m["tool_call_id"] for m in built.messages if m["role"] == "tool"}
    assert sent_calls == sent_results
    assert built.manifest["history_outside_window"] == 60 - len(history)


@pytest.mark.django_db
def test_it_drops_oldest_history_first_to_fit(tenant_a):
    _tiny_model(tenant_a, input_limit=700, output_limit=100)
    session = _session(tenant_a, model="tiny")
    for i in range(30):
        _append(tenant_a, session, MessageInput(role="user", content=f"message number {i} " + "word " * 20))
    built = context_build(tenant=tenant_a, session=session, next_input="newest input")
    kept = [i["seq"] for i in built.manifest["items"] if i["kind"] == "history" and i["included"]]
    dropped = [i["seq"] for i in built.manifest["items"] if i["kind"] == "history" and not i["included"]]
    assert kept and dropped and max(dropped) < min(kept)
    assert kept == list(range(min(kept), 31))
    assert built.budget["prompt_tokens"] <= 700 - 100
    assert built.messages[-1] == {"role": "user", "content": "newest input"}
    assert {w["code"] for w in built.warnings} >= {"history_dropped"}


@pytest.mark.django_db
def test_prompt_too_long_gives_the_numbers_and_records_nothing(tenant_a):
    _tiny_model(tenant_a, input_limit=300, output_limit=100)
    session = _session(tenant_a, model="tiny")
    with pytest.raises(PromptTooLong) as info:
        context_build(tenant=tenant_a, session=session, next_input="word " * 400)
    details = info.value.details
    assert details["gate"] == "tokens"
    assert details["budget_tokens"] == 200 and details["minimal_tokens"] > 200
    assert details["components"]["input"] > 200
    with pytest.raises(PromptTooLong) as info:
        context_build(tenant=tenant_a, session=session, next_input="x" * 8193)
    assert info.value.details == {
        "gate": "characters",
        "input_chars": 8193,
        "char_gate": 8192,
        "policy_field": "char_gate",
    }
    assert BudgetSample.objects.count() == 0
    # the character gate can be turned off
    built = context_build(
        tenant=tenant_a,
        session=session,
        next_input="x" * 8193,
        model_name="gpt-4o",
        overrides={"char_gate": 0},
    )
    assert built.messages[-1]["content"] == "x" * 8193


@pytest.mark.django_db
def test_unknown_model_gets_default_window_and_a_warning(tenant_a):
    session = _session(tenant_a, model="")
    built = context_build(tenant=tenant_a, session=session, next_input="hello", model_name="mystery-model-9")
    assert built.budget["input_limit"] == 64000
    assert built.model.known is False
    assert "unknown_model" in {w["code"] for w in built.warnings}
    assert built.budget["exact"] is False


@pytest.mark.django_db
def test_mode_selects_system_parts_and_tools(tenant_a):
    session = _session(tenant_a)
    built = context_build(
        tenant=tenant_a,
        session=session,
        next_input="plan it",
        system_parts=[
            SystemPart("core", "Core rules."),
            SystemPart("tools", "Tool guide."),
            SystemPart("plan", "Plan only."),
        ],
        tools=[{"type": "function", "function": {"name": "run"}}],
        overrides={"mode": "plan"},
    )
    assert [m["content"] for m in built.messages[:-1]] == ["Core rules.", "Plan only."]
    assert built.tools == [] and built.budget["components"]["tools"] == 0
    reasons = {i["id"]: i["reason"] for i in built.manifest["items"] if not i["included"]}
    assert reasons == {"system:tools": "not used in mode 'plan'", "tools": "not used in mode 'plan'"}


@pytest.mark.django_db
def test_pinned_facts_and_memories_from_the_contracts(
    tenant_a, monkeypatch, django_capture_on_commit_callbacks
):
    calls = {}
    facts = [
        decay.PinnedFact("fact_1", "budget", "Monthly budget is $500.", "high", False),
        decay.PinnedFact("fact_2", "tone", "Friendly tone.", "low", True),
    ]
    memories = [retrieval.RetrievedMemory("exp_1", "Timeouts: add the composite index.", 0.9, 0.9, 0.9, 1.0)]
    monkeypatch.setattr(decay, "facts_for_context", lambda **kw: facts)
    monkeypatch.setattr(
        retrieval, "experiences_for_context", lambda **kw: calls.setdefault("retrieve", kw) and memories
    )
    monkeypatch.setattr(retrieval, "experiences_mark_used", lambda **kw: calls.setdefault("used", kw))
    monkeypatch.setattr(
        decay, "facts_after_build", lambda **kw: calls.setdefault("after", kw) and ["fact budget restated"]
    )
    session = _session(tenant_a)
    with django_capture_on_commit_callbacks(execute=False) as after_commit:
        built = context_build(tenant=tenant_a, session=session, next_input="why is the query slow?")
    # Counted after the build's commit, outside its transaction (no experience row locked in it).
    assert "used" not in calls
    for callback in after_commit:
        callback()
    contents = [m["content"] for m in built.messages]
    assert contents[0].startswith("Pinned fact — budget: Monthly budget is $500.")
    assert "restated" in contents[1]
    # A recalled experience is data in a delimited user-role block, never a system instruction.
    assert built.messages[2]["role"] == "user"
    expected = "Relevant past experience: Timeouts: add the composite index."
    assert f'<recalled_memory source="experience">\n{expected}\n' in contents[2]
    assert calls["retrieve"]["query"] == "why is the query slow?"
    assert calls["retrieve"]["limit"] == 5 and calls["retrieve"]["max_chars"] == 2000
    assert calls["used"] == {"tenant": tenant_a, "experience_ids": ["exp_1"]}
    assert calls["after"]["included_fact_ids"] == ["fact_1", "fact_2"]
    codes = {w["code"] for w in built.warnings}
    assert {"restated_facts", "decay"} <= codes
    assert built.budget["components"]["pinned_facts"] > 0 and built.budget["components"]["memories"] > 0


@pytest.mark.django_db
def test_critical_item_in_the_middle_is_warned_with_its_offset(tenant_a):
    session = _session(tenant_a)
    _append(tenant_a, session, *[MessageInput(role="user", content="filler " * 30) for _ in range(4)])
    _append(
        tenant_a,
        session,
        MessageInput(
            role="user", content="The deploy key must never be logged.", metadata={"critical": True}
        ),
    )
    _append(tenant_a, session, *[MessageInput(role="user", content="filler " * 30) for _ in range(4)])
    built = context_build(tenant=tenant_a, session=session, next_input="go")
    warning = next(w for w in built.warnings if w["code"] == "critical_in_middle")
    assert warning["item"] == "msg:5"
    item = next(i for i in built.manifest["items"] if i["id"] == "msg:5")
    assert warning["offset"] == item["offset"] > 0
    assert 0.3 <= warning["position"] <= 0.7
    assert item["risky"] is True


@pytest.mark.django_db
def test_a_long_new_input_is_never_flagged_as_in_the_middle(tenant_a):
    session = _session(tenant_a)
    _append(tenant_a, session, MessageInput(role="user", content="filler " * 300))
    # The input starts near the middle of the prompt (about half its tokens), yet closes it.
    built = context_build(tenant=tenant_a, session=session, next_input="a long question " * 100)
    assert "critical_in_middle" not in {w["code"] for w in built.warnings}
    item = next(i for i in built.manifest["items"] if i["kind"] == "input")
    assert item["critical"] is True and item["risky"] is False


@pytest.mark.django_db
def test_null_characters_in_the_input_are_refused(tenant_a):
    session = _session(tenant_a)
    with pytest.raises(InvalidInput) as info:
        context_build(tenant=tenant_a, session=session, next_input="a\x00b")
    assert info.value.details == {"fields": {"input": ["Null characters are not allowed."]}}
    with pytest.raises(InvalidInput) as info:
        context_build(tenant=tenant_a, session=session, next_input="a\ud800b")
    assert info.value.details == {"fields": {"input": ["Not valid Unicode text (lone surrogate)."]}}
    assert not BudgetSample.objects.exists()


@pytest.mark.django_db
def test_input_already_appended_is_sent_once(tenant_a):
    session = _session(tenant_a)
    _append(
        tenant_a,
        session,
        MessageInput(role="user", content="first"),
        MessageInput(role="user", content="latest"),
    )
    built = context_build(tenant=tenant_a, session=session, next_input="latest")
    assert [m["content"] for m in built.messages] == ["first", "latest"]


@pytest.mark.django_db
def test_forecast_from_growth_between_builds(tenant_a):
    session = _session(tenant_a)
    for i in range(3):
        _append(
            tenant_a,
            session,
            MessageInput(role="user", content="grow " * 50),
            MessageInput(role="assistant", content="ok " * 50),
        )
        built = context_build(tenant=tenant_a, session=session, next_input=f"turn {i}")
    forecast = built.forecast
    assert forecast["basis"] == "builds"
    assert forecast["growth_tokens_per_turn"] > 90
    threshold = built.budget["threshold_tokens"]
    expected = -(-(threshold - built.budget["demand_tokens"]) // forecast["growth_tokens_per_turn"])
    assert forecast["turns_until_summarisation"] == int(expected)
    assert forecast["turns_until_window"] > forecast["turns_until_summarisation"]


# --- the property test ---------------------------------------------------------------------------

_texts = st.text(
    alphabet=st.sampled_from(list('abcdefghij klmnop,.!?0123456789你好世界{}":\n')), min_size=0, max_size=120
)
_turn = st.one_of(
    st.tuples(st.just("user"), _texts),
    st.tuples(st.just("assistant"), _texts),
    st.tuples(st.just("tools"), st.integers(min_value=1, max_value=3), _texts),
)


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(_turn, min_size=0, max_size=40),
    new_input=st.text(
        st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=200
    ),
    window=st.integers(min_value=1, max_value=40),
    input_limit=st.integers(min_value=400, max_value=3000),
    reserve=st.integers(min_value=0, max_value=200),
    model=st.sampled_from(["prop-o200k", "prop-estimate"]),
)
def test_property_random_sessions(tenant_a, turns, new_input, window, input_limit, reserve, model):
    ModelProfile.objects.update_or_create(
        tenant=tenant_a,
        name="prop-o200k",
        defaults={"input_limit": input_limit, "output_limit": 1000, "tokenizer": "o200k_base"},
    )
    ModelProfile.objects.update_or_create(
        tenant=tenant_a,
        name="prop-estimate",
        defaults={"input_limit": input_limit, "output_limit": 1000, "tokenizer": "estimate:anthropic"},
    )
    session = _session(tenant_a, model=model)
    items: list[MessageInput] = []
    for n, turn in enumerate(turns):
        if turn[0] == "tools":
            calls = [
                {"id": f"c{n}_{k}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for k in range(turn[1])
            ]
            items.append(MessageInput(role="assistant", content="", tool_calls=calls))
            items.extend(MessageInput(role="tool", content=turn[2], tool_call_id=c["id"]) for c in calls)
        else:
            items.append(MessageInput(role=turn[0], content=turn[1]))
    if items:
        _append(tenant_a, session, *items)
    counter = (
        tokens.TokenCounter("o200k_base")
        if model == "prop-o200k"
        else tokens.TokenCounter("estimate:anthropic")
    )
    try:
        built = context_build(
            tenant=tenant_a,
            session=session,
            next_input=new_input,
            overrides={"history_window": window, "output_reserve": reserve},
        )
    except PromptTooLong as exc:
        # refused only when the minimal context (the input) really does not fit
        assert exc.details["gate"] == "tokens"
        assert exc.details["minimal_tokens"] > input_limit - reserve
        assert exc.details["minimal_tokens"] == tokens.REPLY_PRIMING + counter.message_tokens(
            {"role": "user", "content": new_input}
        )
        return
    # never over the budget
    assert built.budget["prompt_tokens"] <= input_limit - reserve
    # the manifest total is the exact count of the returned prompt
    assert built.manifest["total_tokens"] == counter.prompt_tokens(built.messages, built.tools)
    # the newest input is present, last
    assert built.messages[-1] == {"role": "user", "content": new_input}
    # no tool call without all its results and no result without its call, results right after their call
    pending: set[str] = set()
    for message in built.messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in pending
            pending.discard(message["tool_call_id"])
        else:
            assert not pending, "a tool call was separated from its results"
            pending = {c["id"] for c in message.get("tool_calls", [])}
    assert not pending
