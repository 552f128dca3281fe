"""Text a database cannot store is refused at the door with a 422 naming the field."""

from __future__ import annotations

import pytest

from memory.models import Message

pytestmark = pytest.mark.django_db


def post_raw(client, path: str, body: str):
    return client.generic("POST", path, body, content_type="application/json")


@pytest.mark.parametrize(
    ("escape", "word"),
    [("\\u0000", "NUL"), ("\\ud800", "surrogate")],
)
def test_unstorable_text_in_a_message_is_422_naming_the_field(api_a, escape, word):
    session = api_a.post("/api/v1/sessions", {"agent": "a1"}, format="json").json()["id"]
    bad = '{"role": "user", "content": "a' + escape + 'b"}'
    body = '{"messages": [{"role": "user", "content": "fine"}, ' + bad + "]}"
    response = post_raw(api_a, f"/api/v1/sessions/{session}/messages", body)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    assert list(error["details"]["fields"]) == ["messages[1].content"]
    assert word in error["message"]
    assert Message.objects.count() == 0  # the whole batch is refused


def test_unstorable_text_in_a_search_query_is_422(api_a):
    response = post_raw(api_a, "/api/v1/experiences/search", '{"query": "disk \\u0000 full"}')
    assert response.status_code == 422, response.content
    assert list(response.json()["error"]["details"]["fields"]) == ["query"]


def test_ordinary_unicode_passes(api_a):
    session = api_a.post("/api/v1/sessions", {"agent": "a1"}, format="json").json()["id"]
    response = post_raw(
        api_a,
        f"/api/v1/sessions/{session}/messages",
        '{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00 你好"}',
    )
    assert response.status_code == 201, response.content
    assert Message.objects.get().content == "café 😀 你好"


def test_what_only_looks_like_an_escape_is_stored_and_a_nul_in_a_key_is_refused(api_a):
    # The parser walks a body value by value only when its text holds a \u0000 or surrogate
    # escape; an escaped backslash before "u0000" is plain text, a key is checked too.
    session = api_a.post("/api/v1/sessions", {"agent": "a1"}, format="json").json()["id"]
    path = f"/api/v1/sessions/{session}/messages"
    response = post_raw(api_a, path, '{"role": "user", "content": "a \\\\u0000 b"}')
    assert response.status_code == 201, response.content
    assert Message.objects.get().content == "a \\u0000 b"
    response = post_raw(api_a, path, '{"role": "user", "content": "x", "metadata": {"k\\u0000": 1}}')
    assert response.status_code == 422, response.content
    assert "NUL" in response.json()["error"]["message"]
    assert Message.objects.count() == 1
