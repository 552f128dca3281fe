"""Every operation of the schema declares the errors it can answer, with the error envelope."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema: dict):
    for path, item in schema["paths"].items():
        if path.startswith("/api/v1/"):
            for method, op in item.items():
                yield path, method, op


def test_the_error_envelope_is_a_component(schema: dict) -> None:
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert error["properties"]["error"]["required"] == ["code", "message", "details"]


def test_every_operation_declares_its_error_responses(schema: dict) -> None:
    missing = []
    for path, method, op in operations(schema):
        expected = {"401", "403", "429", "503"}
        if method in {"post", "put", "patch"}:
            expected |= {"400", "404", "409", "413", "415", "422"}
        if "{" in path:
            expected.add("404")
        if any(p["in"] == "query" for p in op.get("parameters", [])):
            expected.add("422")
        for code in sorted(expected - set(op["responses"])):
            missing.append(f"{method.upper()} {path}: {code}")
        for code in expected & set(op["responses"]):
            body = op["responses"][code]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/Error"}, (path, method, code)
    assert not missing, missing


def test_success_statuses_are_the_ones_the_views_answer(schema: dict) -> None:
    promote = schema["paths"]["/api/v1/experiences/promote"]["post"]["responses"]
    assert {"200", "201"} <= set(promote)
    revoke = schema["paths"]["/api/v1/tenant/api-keys/{prefix}"]["delete"]["responses"]
    assert "204" not in revoke
    assert revoke["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ApiKeyOutput"
    }
    distill = schema["paths"]["/api/v1/tasks/{task_id}/distill"]["post"]["responses"]
    assert {"200", "202"} <= set(distill)


@pytest.mark.django_db
def test_the_revoke_answers_what_the_schema_says(make_client, tenant_a) -> None:
    admin = make_client(tenant_a, ["admin"])
    created = admin.post("/api/v1/tenant/api-keys", {"name": "temp"}, format="json").json()
    revoked = admin.delete(f"/api/v1/tenant/api-keys/{created['prefix']}")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
