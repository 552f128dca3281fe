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
