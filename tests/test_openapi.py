"""The OpenAPI schema is complete and clean: bearer auth, unique readable operation ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from django.core.management import call_command


@pytest.fixture(scope="module")
def schema(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path: Path = tmp_path_factory.mktemp("schema") / "schema.yaml"
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", str(path))
    return yaml.safe_load(path.read_text())


def test_the_schema_generates_without_a_warning_and_declares_bearer_keys(schema: dict) -> None:
    assert schema["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key of the tenant: `Authorization: Bearer ctx_…`.",
    }
    operations = [op for path in schema["paths"].values() for op in path.values()]
    assert all({"ApiKey": []} in op["security"] for op in operations)


def test_lists_and_reads_have_distinct_operation_ids(schema: dict) -> None:
    ids = [op["operationId"] for path in schema["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert schema["paths"]["/api/v1/sessions"]["get"]["operationId"] == "v1_sessions_list"
    assert schema["paths"]["/api/v1/sessions/{session_id}"]["get"]["operationId"] == "v1_sessions_retrieve"


def test_every_capability_is_in_the_schema(schema: dict) -> None:
    for path in (
        "/api/v1/sessions/{session_id}/messages",
        "/api/v1/sessions/{session_id}/context",
        "/api/v1/experiences/search",
        "/api/v1/agents/{agent}/recovered-state",
        "/api/v1/sessions/{session_id}/facts",
        "/api/v1/tokens/count",
    ):
        assert path in schema["paths"], path


def test_each_operation_has_its_own_description_and_a_capability_tag(schema: dict) -> None:
    operations = [(path, op) for path, item in schema["paths"].items() for op in item.values()]
    descriptions = [op.get("description", "") for _, op in operations]
    assert all(descriptions)
    repeated = {d for d in descriptions if descriptions.count(d) > 1}
    assert not repeated, repeated
    tags = {tag for _, op in operations for tag in op["tags"]}
    assert len(tags) > 5, tags
    assert schema["paths"]["/api/v1/sessions"]["post"]["tags"] == ["Sessions"]
    assert schema["paths"]["/api/v1/experiences/search"]["post"]["tags"] == ["Experiences"]
    declared = {tag["name"] for tag in schema["tags"]}
    assert tags <= declared, tags - declared


def test_session_routes_document_addressing_by_agent_and_key(schema: dict) -> None:
    for path, item in schema["paths"].items():
        if "{session_id}" not in path:
            continue
        for operation in item.values():
            names = {(p["in"], p["name"]) for p in operation["parameters"]}
            assert {("path", "session_id"), ("query", "agent"), ("query", "key")} <= names, path
