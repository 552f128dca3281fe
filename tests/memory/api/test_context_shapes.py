"""The context build's answer is described field by field in /api/schema/, and a real answer
validates against that description: the prompt, the manifest, the budget, the policy."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from drf_spectacular.generators import SchemaGenerator

from memory.api.context_shapes import ManifestItemSerializer
from memory.models import BudgetSample
from memory.services import decay, message_indexing
from memory.services.sessions import MessageInput, messages_append, session_create
from memory.services.user_memory.store import memory_record

BUILD = "/api/v1/sessions/{session_id}/context"
# The caller's own JSON, echoed as given: free-form by design.
FREE_FORM = {"$.tools[]", "$.messages[].tool_calls[]"}
CALL = {"id": "c1", "type": "function", "function": {"name": "logs", "arguments": "{}"}}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """`node` with its `$ref` (or a lone `allOf` of one `$ref`, drf-spectacular's way of giving a
    referenced field a description) replaced by the component."""
    if "$ref" in node:
        return _resolve(schema, schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]])
    if len(node.get("allOf", [])) == 1:
        return _resolve(schema, node["allOf"][0])
    return node


def _build_response_schema(schema: dict[str, Any], method: str = "post") -> dict[str, Any]:
    content = schema["paths"][BUILD][method]["responses"]["200"]["content"]["application/json"]
    return _resolve(schema, content["schema"])


def _json_schema(schema: dict[str, Any], node: Any) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema: references inlined, `nullable` as a null type."""
    if isinstance(node, list):
        return [_json_schema(schema, n) for n in node]
    if not isinstance(node, dict):
        return node
    node = _resolve(schema, node)
    out = {k: _json_schema(schema, v) for k, v in node.items() if k not in ("nullable", "readOnly")}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


def _untyped_objects(schema: dict[str, Any], node: dict[str, Any], value: Any, where: str) -> list[str]:
    """Paths of the answer's objects that the schema describes as a bare object (no properties,
    no typed values), walking the answer and its schema together."""
    node = _resolve(schema, node)
    found: list[str] = []
    if isinstance(value, list):
        for item in value:
            found += _untyped_objects(schema, node.get("items", {}), item, f"{where}[]")
        return sorted(set(found))
    if not isinstance(value, dict) or where in FREE_FORM:
        return found
    properties, extra = node.get("properties", {}), node.get("additionalProperties")
    if not properties and not extra:
        return [where]
    for key, inner in value.items():
        if key in properties:
            found += _untyped_objects(schema, properties[key], inner, f"{where}.{key}")
        elif isinstance(extra, dict):
            found += _untyped_objects(schema, extra, inner, f"{where}.*")
        else:
            found.append(f"{where}.{key} (not in the schema)")
    return sorted(set(found))


@pytest.fixture
def built(api_a: Any, tenant_a: Any) -> tuple[Any, dict[str, Any]]:
    """A real build that carries every kind of part: system parts, tools, the user's profile, a
    pinned fact, history with a tool-call group, a recalled message of an earlier session, open
    questions, the input."""
    earlier = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1")
    messages_append(
        tenant=tenant_a,
        session=earlier,
        items=[MessageInput(role="user", content="I adopted a golden retriever named Biscuit.", name="Cara")],
    )
    session = session_create(tenant=tenant_a, agent_external_id="bot", user_id="u1", model_name="gpt-4o")
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="user", content="The deploy fails with a 502."),
            MessageInput(role="assistant", content="", tool_calls=[CALL]),
            MessageInput(role="tool", content="upstream timed out", tool_call_id="c1"),
            MessageInput(role="assistant", content="The upstream timed out."),
        ],
    )
    decay.fact_register(
        tenant=tenant_a, session=session, key="region", fact_type="constraint", content="Only eu-west-1"
    )
    memory_record(
        tenant=tenant_a, user_id="u1", subject="style.answers", text="Prefers short answers.",
        memory_type="preference", agent="bot",
    )  # fmt: skip
    message_indexing.memory_index_drain()
    response = api_a.post(
        f"/api/v1/sessions/{session.public_id}/context",
        {
            "input": "What was my dog's name, and how do I fix the 502?",
            "system_parts": {"core": "You are helpful.", "style": "Be brief."},
            "tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}],
            "open_questions": ["Which region?"],
            "next_actions": ["Read the logs."],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    return session, response.json()


@pytest.mark.django_db
def test_every_object_of_a_real_build_is_described_by_the_schema(schema, built) -> None:
    _, body = built
    kinds = {item["kind"] for item in body["manifest"]["items"]}
    assert {
        "system_part", "tools", "user_profile", "pinned_fact", "history", "recall", "open_questions", "input"
    } <= kinds  # fmt: skip
    assert _untyped_objects(schema, _build_response_schema(schema), body, "$") == []


@pytest.mark.django_db
def test_the_recorded_builds_are_described_and_validate(schema, built, api_a) -> None:
    session, body = built
    listing = api_a.get(f"/api/v1/sessions/{session.public_id}/context").json()
    assert [b["build_id"] for b in listing["builds"]] == [body["build_id"]]
    assert listing["builds"][0]["manifest"]["items"] == body["manifest"]["items"]
    described = _build_response_schema(schema, "get")
    assert _untyped_objects(schema, described, listing, "$") == []
    jsonschema.validate(listing, _json_schema(schema, described))


@pytest.mark.django_db
def test_a_real_build_validates_against_its_schema(schema, built) -> None:
    _, body = built
    described = _json_schema(schema, _build_response_schema(schema))
    jsonschema.validate(body, described)
    # The schema refuses what the answer would not be: it is not `{}` in disguise.
    broken = copy.deepcopy(body)
    broken["budget"]["components"]["history"] = "many"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, described)


@pytest.mark.django_db
def test_the_answer_is_the_build_the_service_recorded(built) -> None:
    """The manifest, budget figures, warnings and forecast answered are the stored ones, key for
    key and number for number (1.0 stays 1.0); the model and policy keep their documented keys."""
    session, body = built
    sample = BudgetSample.objects.get(session=session, public_id=body["build_id"])

    def text(value: Any) -> str:
        return json.dumps(value, sort_keys=True)

    assert text(body["manifest"]) == text(sample.manifest)
    assert text(body["warnings"]) == text(sample.warnings)
    assert text(body["forecast"]) == text(sample.forecast)
    assert text(body["budget"]["components"]) == text(sample.components)
    assert body["budget"]["prompt_tokens"] == sample.prompt_tokens == body["manifest"]["total_tokens"]
    assert body["session"] == session.public_id
    assert list(body) == [
        "build_id",
        "session",
        "model",
        "messages",
        "tools",
        "manifest",
        "budget",
        "warnings",
        "forecast",
        "summarisation",
        "policy",
    ]
    assert body["model"] == {
        "name": "gpt-4o",
        "profile": "gpt-4o",
        "provider": "openai",
        "input_limit": 128000,
        "output_limit": 16384,
        "tokenizer": "o200k_base",
        "source": "builtin",
        "aliases": [],
        "known": True,
        "exact": True,
    }
    assert list(body["policy"])[-3:] == ["mode_parts", "default_model", "recall"]
    assert list(body["policy"]["recall"]) == [
        "enabled",
        "top_k",
        "min_score",
        "min_similarity",
        "position",
        "budget_share",
        "max_tokens",
    ]
    summarisation = ["queued", "already_queued", "reason", "threshold", "covered_up_to_seq"]
    assert list(body["summarisation"]) == summarisation
    tool_turn = next(m for m in body["messages"] if m.get("tool_calls"))
    assert tool_turn == {"role": "assistant", "content": None, "tool_calls": [CALL]}


def test_a_stored_document_keeps_its_key_order_and_a_key_the_serializer_does_not_know() -> None:
    item = {"kind": "input", "id": "input", "component": "input", "tokens": 3, "score": None}
    item |= {"critical": True, "required": True, "included": True, "reason": "included"}
    item |= {"offset": 7, "novel": {"x": 1}, "position": 0.5}
    assert json.dumps(ManifestItemSerializer(item).data) == json.dumps(item)
