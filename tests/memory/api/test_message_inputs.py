"""Message input validation at the edge (no database): one message, a batch, every bad field named."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from memory.api.message_inputs import message_inputs_validate
from memory.exceptions import InvalidInput
from memory.services.sessions import MessageInput


def test_a_batch_is_parsed_whole_and_every_bad_field_is_named():
    items, is_batch = message_inputs_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert is_batch and items == [MessageInput(role="user", content="hi")]
    with pytest.raises(InvalidInput) as bad:
        message_inputs_validate(
            {
                "messages": [
                    {"role": "user", "content": "fine"},
                    {"role": "tool", "content": "no call id"},
                    {"role": "assistant", "tool_calls": "lookup()"},
                    "not an object",
                ]
            }
        )
    fields = bad.value.details["fields"]
    assert set(fields) == {"messages[1].tool_call_id", "messages[2].tool_calls", "messages[3]"}
    with pytest.raises(InvalidInput) as extra:
        message_inputs_validate({"messages": [{"role": "user", "content": "hi"}], "session": "x"})
    assert "session" in extra.value.details["fields"]
    with pytest.raises(InvalidInput):
        message_inputs_validate([{"role": "user"}])


def test_tool_call_arguments_may_be_a_json_string_or_an_object():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"q": 1}}}
    [item], _ = message_inputs_validate({"role": "assistant", "tool_calls": [call]})
    assert item.tool_calls == [call]


def test_fields_are_strict_json_types_and_each_error_says_how_to_fix_it():
    cases = {
        "content": ({"role": "user", "content": 5}, "Must be a string."),
        "turn_id": (
            {"role": "user", "content": "hi", "turn_id": "t" * 201},
            "Must be at most 200 characters.",
        ),
        "parent_seq": ({"role": "user", "content": "hi", "parent_seq": "5"}, "Must be a positive integer"),
        "metadata": ({"role": "user", "content": "hi", "metadata": []}, "Must be an object."),
        "artifact_refs": ({"role": "user", "content": "hi", "artifact_refs": {}}, "Must be a list."),
        "occurred_at": (
            {"role": "user", "content": "hi", "occurred_at": "2024-01-01T10:00:00"},
            "Must carry a time zone",
        ),
        "colour": ({"role": "user", "content": "hi", "colour": "red"}, "Unknown field. Known:"),
        "role": ({"content": "no role"}, "Must be one of assistant, system, tool, user; got None."),
    }
    for field, (body, message) in cases.items():
        with pytest.raises(InvalidInput) as bad:
            message_inputs_validate(body)
        assert list(bad.value.details["fields"]) == [field], field
        assert bad.value.details["fields"][field][0].startswith(message), field
    with pytest.raises(InvalidInput) as only_assistant:
        message_inputs_validate(
            {
                "role": "user",
                "content": "hi",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}],
            }
        )
    assert only_assistant.value.details["fields"] == {
        "tool_calls": ["Only an assistant message may carry tool calls."]
    }


def test_a_valid_message_becomes_a_typed_message_input_with_defaults_for_nulls():
    when = (timezone.now() - timedelta(days=3)).replace(microsecond=0)
    [item], is_batch = message_inputs_validate(
        {
            "role": "tool",
            "content": None,
            "tool_call_id": "c1",
            "metadata": None,
            "occurred_at": when.isoformat(),
        }
    )
    assert not is_batch
    assert item == MessageInput(role="tool", content="", tool_call_id="c1", occurred_at=when)


def test_a_turn_that_says_nothing_is_refused_but_a_call_of_tools_or_a_tool_answer_may_be_empty():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    empty = [{"role": "user"}, {"role": "user", "content": ""}, {"role": "user", "content": None},
             {"role": "system"}, {"role": "assistant"}, {"role": "assistant", "content": ""}]  # fmt: skip
    for body in empty:
        with pytest.raises(InvalidInput) as bad:
            message_inputs_validate(body)
        assert list(bad.value.details["fields"]) == ["content"], body
        assert "needs content" in bad.value.message, body
    with pytest.raises(InvalidInput) as in_batch:
        message_inputs_validate({"messages": [{"role": "user", "content": "hi"}, {"role": "user"}]})
    assert list(in_batch.value.details["fields"]) == ["messages[1].content"]
    [calls], _ = message_inputs_validate({"role": "assistant", "tool_calls": [call]})
    assert calls.content == "" and calls.tool_calls == [call]
    [answer], _ = message_inputs_validate({"role": "tool", "tool_call_id": "c1", "content": ""})
    assert answer.content == ""
