"""Message validation answers as the serializer does, one message or a batch, with each error
named by its field path. Hypothesis generates valid, borderline and invalid bodies.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework import serializers

from memory.api.base import MAX_BIGINT
from memory.api.message_inputs import (
    _MESSAGE_VALIDATOR,
    ROLES,
    message_input_errors,
    message_inputs_validate,
)
from memory.exceptions import InvalidInput

WRONG_TYPES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False), st.just([]), st.just({})
)
TEXT = st.text(st.characters(codec="utf-8", categories=("L", "N", "Zs", "Cc")), max_size=8)


def strings(limit: int | None) -> st.SearchStrategy[Any]:
    """Short strings (NUL and control characters included), strings at and past the limit, wrong types."""
    borderline = (
        st.nothing() if limit is None else st.sampled_from([limit - 1, limit, limit + 1]).map("x".__mul__)
    )
    return st.one_of(TEXT, st.just("a\x00b"), borderline, WRONG_TYPES)


def contents() -> st.SearchStrategy[Any]:
    limit = settings.CTXAPP.message_max_bytes
    around = st.sampled_from([limit // 4 - 1, limit // 4 + 1, limit // 2, limit // 2 + 1])
    return st.one_of(strings(None), around.map("é".__mul__), st.just("x" * limit), st.just("x" * (limit + 1)))


CALL = st.fixed_dictionaries(
    {
        "id": st.one_of(st.just("c1"), st.just(""), st.integers(0, 2)),
        "type": st.one_of(st.just("function"), st.just("tool"), st.none()),
        "function": st.one_of(
            st.fixed_dictionaries(
                {
                    "name": st.one_of(st.just("lookup"), st.just(""), st.none()),
                    "arguments": st.one_of(st.just("{}"), st.just({"q": 1}), st.integers(0, 2), st.none()),
                }
            ),
            st.just("lookup()"),
            st.none(),
        ),
    }
)
VALID_CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
NOW = datetime.now(tz=UTC)
TIMES = st.one_of(
    st.sampled_from(
        [
            "2024-05-08T13:56:00Z",
            "2024-05-08T13:56:00+02:00",
            "2024-05-08T13:56:00",  # no time zone
            (NOW + timedelta(days=3)).isoformat(),  # too far ahead
            "yesterday",
        ]
    ),
    WRONG_TYPES,
)

FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "role": st.one_of(st.sampled_from(ROLES), st.just("robot"), WRONG_TYPES),
    "content": contents(),
    "turn_id": strings(200),
    "tool_call_id": strings(200),
    "event_kind": strings(64),
    "name": strings(200),
    "tool_calls": st.one_of(
        st.lists(st.one_of(CALL, st.just(VALID_CALL), WRONG_TYPES), max_size=3), WRONG_TYPES
    ),
    "parent_seq": st.one_of(
        st.sampled_from([0, 1, 2, MAX_BIGINT, MAX_BIGINT + 1, -1, True, 1.5, "3"]), st.none()
    ),
    "artifact_refs": st.one_of(st.lists(TEXT, max_size=2), WRONG_TYPES),
    "metadata": st.one_of(st.dictionaries(TEXT, st.integers(), max_size=2), WRONG_TYPES),
    "occurred_at": TIMES,
}
UNKNOWN = st.dictionaries(
    st.sampled_from(["session", "Role", "contents", "seq", ""]), st.integers(), max_size=1
)


@st.composite
def bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A message body: a subset of the known fields (role usually there) plus, sometimes, unknown ones."""
    names = draw(st.sets(st.sampled_from(sorted(FIELD_VALUES))))
    if draw(st.integers(0, 9)):
        names.add("role")
    body = {name: draw(FIELD_VALUES[name]) for name in sorted(names)}
    if not draw(st.integers(0, 5)):
        body.update(draw(UNKNOWN))
    return body


def serializer_answer(body: Any) -> tuple[Any, dict[str, list[str]]]:
    try:
        return _MESSAGE_VALIDATOR.run_validation(body), {}
    except serializers.ValidationError as exc:
        assert isinstance(exc.detail, dict)
        return None, {name: [str(m) for m in messages] for name, messages in exc.detail.items()}


@hypothesis_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
@example({"role": "user", "content": "hi"})
@example({"role": "tool", "content": "no call id"})
@example({"role": "user", "tool_calls": [VALID_CALL]})
@example({"role": "assistant", "tool_calls": [VALID_CALL], "parent_seq": MAX_BIGINT})
@example({"role": "user", "turn_id": "x" * 201})
@example({"role": "user", "content": None, "name": None, "session": 1})
def test_a_message_is_answered_as_the_serializer_answers_it_with_each_field_named(body):
    expected = serializer_answer(body)
    assert message_input_errors(body) == expected
    prefixed = message_input_errors(body, prefix="messages[7].")
    assert prefixed == (expected[0], {f"messages[7].{name}": errors for name, errors in expected[1].items()})


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.lists(bodies(), min_size=1, max_size=4))
def test_a_batch_is_refused_with_each_bad_message_named_as_the_serializer_names_it(batch):
    answers = [serializer_answer(body) for body in batch]
    expected = {
        f"messages[{index}].{name}": errors
        for index, (_, found) in enumerate(answers)
        for name, errors in found.items()
    }
    try:
        items, is_batch = message_inputs_validate({"messages": batch})
    except InvalidInput as refused:
        assert refused.details["fields"] == expected
    else:
        assert is_batch and not expected and items == [item for item, _ in answers]
