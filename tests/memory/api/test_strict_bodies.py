"""Request bodies hold only what the API declares, and free JSON in them is bounded in bytes.

The walk takes every write operation from the OpenAPI schema itself, so a new endpoint whose
serializer forgets the shared base (memory.api.base.BodySerializer) fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from drf_spectacular.generators import SchemaGenerator

from memory.models import Session, Task

pytestmark = pytest.mark.django_db

TYPO = "idle_ttl_secondz"
# Bodies that are free JSON by design: the whole state document, and OTLP's own format.
FREE_BODIES = {("put", "/api/v1/agents/{agent}/state"), ("post", "/v1/traces")}


@pytest.fixture
def ids(api_a) -> dict[str, str]:
    session = api_a.post("/api/v1/sessions", {"agent": "agent-1", "user_id": "u1"}, format="json").json()
    api_a.post(f"/api/v1/sessions/{session['id']}/messages", {"role": "user", "content": "hi"}, format="json")
    task = api_a.post("/api/v1/tasks", {"agent": "agent-1", "session": session["id"]}, format="json").json()
    checkpoint = api_a.post(
        "/api/v1/agents/agent-1/checkpoints", {"state": {"schema_version": 1}}, format="json"
    ).json()
    fact = api_a.post(
        f"/api/v1/sessions/{session['id']}/facts",
        {"key": "db", "type": "constraint", "content": "PostgreSQL 18"},
        format="json",
    ).json()
    experience = api_a.post("/api/v1/experiences", {"problem": "p", "solution": "s"}, format="json").json()
    memory = api_a.post(
        "/api/v1/users/u1/memories", {"subject": "home", "text": "Lisbon"}, format="json"
    ).json()
    return {
        "agent": "agent-1",
        "session_id": session["id"],
        "task_id": task["id"],
        "ref": checkpoint["id"],
        "fact_id": fact["id"],
        "experience_id": experience["id"],
        "seq": "1",
        "user_id": "u1",
        "memory_id": memory["id"],
        "sha256": "0" * 64,
    }


def _write_operations() -> list[tuple[str, str, dict[str, Any]]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in {"post", "put", "patch"} and "requestBody" in operation:
                found.append((method, path, operation))
    return found


def test_every_write_operation_refuses_an_unknown_field_naming_it(tenant_a, make_client, ids) -> None:
    api = make_client(tenant_a, ["admin"])
    operations = _write_operations()
    checked = []
    for method, path, _ in operations:
        if (method, path) in FREE_BODIES:
            continue
        url = path.format(**ids)
        response = getattr(api, method)(url, {TYPO: 1}, format="json", HTTP_X_AGENT_ID="agent-1")
        assert response.status_code == 422, (method, path, response.status_code, response.content[:300])
        error = response.json()["error"]
        assert error["code"] == "validation_error", (method, path, error)
        assert TYPO in error["details"]["fields"], (method, path, error)
        checked.append((method, path))
    assert len(checked) >= 30, checked


def test_a_typo_in_a_session_leaves_nothing_behind(api_a) -> None:
    response = api_a.post(
        "/api/v1/sessions", {"agent": "bot", "idle_ttl_seconds": 120}, format="json"
    )  # the field is ttl_seconds
    assert response.status_code == 422
    fields = response.json()["error"]["details"]["fields"]
    assert list(fields) == ["idle_ttl_seconds"] and "ttl_seconds" in fields["idle_ttl_seconds"][0]
    assert not Session.objects.exists()


def test_the_schema_closes_each_request_body_it_checks() -> None:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    component = schema["components"]["schemas"]["SessionCreateRequest"]
    assert component["additionalProperties"] is False
    assert component["properties"]["metadata"]["additionalProperties"] == {}  # free JSON stays open


@override_settings()
def test_free_json_fields_are_bounded_in_bytes(api_a, settings) -> None:
    import dataclasses

    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, max_json_field_bytes=1024)
    big = {"blob": "x" * 1100}
    session = api_a.post("/api/v1/sessions", {"agent": "bot", "metadata": big}, format="json")
    assert session.status_code == 422
    assert "1024" in session.json()["error"]["details"]["fields"]["metadata"][0]
    assert not Session.objects.exists()
    task = api_a.post("/api/v1/tasks", {"agent": "bot", "metadata": big}, format="json")
    assert task.status_code == 422 and "metadata" in task.json()["error"]["details"]["fields"]
    assert not Task.objects.exists()

    ok = api_a.post("/api/v1/sessions", {"agent": "bot", "metadata": {"blob": "x" * 900}}, format="json")
    assert ok.status_code == 201
    sid = ok.json()["id"]
    message = api_a.post(
        f"/api/v1/sessions/{sid}/messages", {"role": "user", "content": "hi", "metadata": big}, format="json"
    )
    assert message.status_code == 422 and "metadata" in message.json()["error"]["details"]["fields"]
    batch = api_a.post(
        f"/api/v1/sessions/{sid}/messages",
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b", "metadata": big}]},
        format="json",
    )
    assert batch.status_code == 422
    assert "messages[1].metadata" in batch.json()["error"]["details"]["fields"]
    usage = api_a.post(f"/api/v1/sessions/{sid}/usage", {"usage": {"prompt_tokens": 1, **big}}, format="json")
    assert usage.status_code == 422 and "usage" in usage.json()["error"]["details"]["fields"]
    assert Session.objects.get(public_id=sid).message_count == 0


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 2**31},
        {"prompt_tokens": 1, "completion_tokens": 2**63},
        {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 2**31}},
        {"prompt_tokens": 1, "completion_tokens_details": {"reasoning_tokens": 2**40}},
    ],
)
def test_openai_usage_past_a_postgresql_integer_answers_422(api_a, usage) -> None:
    sid = api_a.post("/api/v1/sessions", {"agent": "bot"}, format="json").json()["id"]
    built = api_a.post(f"/api/v1/sessions/{sid}/context", {"input": "hi"}, format="json")
    assert built.status_code == 200, built.content
    response = api_a.post(
        f"/api/v1/sessions/{sid}/usage", {"build_id": built.json()["build_id"], "usage": usage}, format="json"
    )
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "validation_error"
    assert next(iter(response.json()["error"]["details"]["fields"])).startswith("usage.")


def _string_properties(schema: dict[str, Any], operation: dict[str, Any]) -> dict[str, Any]:
    """Each string property of the operation's JSON body (an array of strings too): the number to
    send for it (123, or [123]), and whether it is free text (no format or enum of its own, whose
    errors say what the value must look like instead)."""
    body = operation["requestBody"]["content"].get("application/json", {}).get("schema", {})
    if "$ref" in body:
        body = schema["components"]["schemas"][body["$ref"].rsplit("/", 1)[-1]]
    found = {}
    for name, prop in body.get("properties", {}).items():
        if prop.get("readOnly"):
            continue
        if prop.get("type") == "string":
            found[name] = (123, "format" not in prop and "enum" not in prop)
        elif prop.get("type") == "array" and prop.get("items", {}).get("type") == "string":
            found[name] = ([123], "format" not in prop["items"] and "enum" not in prop["items"])
    return found


def test_a_number_for_a_string_is_refused_on_every_write(tenant_a, make_client, ids) -> None:
    # DRF's CharField turns 123 into "123"; the API takes a JSON string as sent, like every type.
    api = make_client(tenant_a, ["admin"])
    schema = SchemaGenerator().get_schema(request=None, public=True)
    checked = []
    for method, path, operation in _write_operations():
        if (method, path) in FREE_BODIES:
            continue
        for name, (number, free_text) in _string_properties(schema, operation).items():
            url = path.format(**ids)
            response = getattr(api, method)(url, {name: number}, format="json", HTTP_X_AGENT_ID="agent-1")
            assert response.status_code == 422, (method, path, name, response.status_code, response.content)
            fields = response.json()["error"]["details"].get("fields", {})
            assert name in fields, (method, path, name, fields)
            assert not free_text or "string" in str(fields[name]), (method, path, name, fields)
            checked.append((method, path, name))
    assert len(checked) >= 60, checked
    assert ("post", "/api/v1/sessions/{session_id}/context", "input") in checked
    assert ("patch", "/api/v1/tasks/{task_id}", "output") in checked


def test_a_number_for_a_string_stores_nothing(api_a, ids) -> None:
    built = api_a.post(f"/api/v1/sessions/{ids['session_id']}/context", {"input": 123}, format="json")
    assert built.status_code == 422, built.content
    assert built.json()["error"]["details"]["fields"] == {"input": ["Must be a string."]}
    patched = api_a.patch(f"/api/v1/tasks/{ids['task_id']}", {"output": 123}, format="json")
    assert patched.status_code == 422, patched.content
    assert Task.objects.get(public_id=ids["task_id"]).output == ""
    nested = api_a.post(
        "/api/v1/memory/search",
        {"query": "x", "scope": {"user_id": 7}, "kinds": ["message", 1]},
        format="json",
    )
    assert nested.status_code == 422, nested.content
    assert set(nested.json()["error"]["details"]["fields"]) == {"scope", "kinds"}
