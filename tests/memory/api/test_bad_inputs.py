"""Inputs that used to answer 500 answer a 4xx with the error envelope, and store nothing."""

from __future__ import annotations

import pytest

from memory.models import Checkpoint, Message
from memory.services.sessions import agent_get_or_create

pytestmark = pytest.mark.django_db

BIGINT_OVERFLOW = 2**63


def envelope(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


@pytest.fixture
def session_id(api_a) -> str:
    return api_a.post("/api/v1/sessions", {"agent": "a1"}, format="json").json()["id"]


@pytest.mark.parametrize("role", [{}, ["user"], {"user": 1}])
def test_a_role_that_is_not_a_string_is_422_single_and_in_a_batch(api_a, session_id, role):
    url = f"/api/v1/sessions/{session_id}/messages"
    single = api_a.post(url, {"role": role, "content": "hi"}, format="json")
    assert list(envelope(single, 422, "validation_error")["details"]["fields"]) == ["role"]
    batch = api_a.post(
        url, {"messages": [{"role": "user", "content": "ok"}, {"role": role, "content": "x"}]}, format="json"
    )
    assert list(envelope(batch, 422, "validation_error")["details"]["fields"]) == ["messages[1].role"]
    assert Message.objects.count() == 0


def test_a_parent_seq_beyond_bigint_is_422(api_a, session_id):
    url = f"/api/v1/sessions/{session_id}/messages"
    response = api_a.post(url, {"role": "user", "content": "x", "parent_seq": BIGINT_OVERFLOW}, format="json")
    assert list(envelope(response, 422, "validation_error")["details"]["fields"]) == ["parent_seq"]
    largest = api_a.post(url, {"role": "user", "content": "x", "parent_seq": 2**63 - 1}, format="json")
    assert largest.status_code == 201, largest.content


def test_other_integers_beyond_bigint_are_422(api_a, session_id, tenant_a):
    agent_get_or_create(tenant=tenant_a, external_id="a1")
    checkpoint = api_a.post(
        "/api/v1/agents/a1/checkpoints", {"step": BIGINT_OVERFLOW, "state": {}}, format="json"
    )
    assert "step" in envelope(checkpoint, 422, "validation_error")["details"]["fields"]
    assert Checkpoint.objects.count() == 0
    events = api_a.get(f"/api/v1/agents/a1/events?after={BIGINT_OVERFLOW}")
    assert "after" in envelope(events, 422, "validation_error")["details"]["fields"]
    state = api_a.put("/api/v1/agents/a1/state", {"schema_version": 1}, format="json", HTTP_IF_MATCH="²")
    envelope(state, 422, "validation_error")


@pytest.mark.parametrize("depth", [101, 950, 5000])
def test_json_nested_too_deeply_is_422_naming_where(api_a, session_id, depth):
    body = '{"role": "user", "content": "x", "metadata": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    response = api_a.generic(
        "POST", f"/api/v1/sessions/{session_id}/messages", body, content_type="application/json"
    )
    error = envelope(response, 422, "validation_error")
    (field,) = error["details"]["fields"]
    assert "Nested deeper than 100 levels" in error["message"]
    # Where the decoder could read it all, the path names where the cap was crossed.
    assert field.startswith(("metadata", "body"))
    if depth == 101:
        assert field == "metadata" + ".a" * 99
    assert Message.objects.count() == 0


def test_nesting_within_the_cap_is_accepted(api_a, session_id):
    body = '{"role": "user", "content": "x", "metadata": {"a": ' + "[" * 90 + "]" * 90 + "}}"
    response = api_a.generic(
        "POST", f"/api/v1/sessions/{session_id}/messages", body, content_type="application/json"
    )
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/sessions/sess_%00",
        "/api/v1/sessions/sess_%00/messages",
        "/api/v1/tasks/task_%00",
        "/api/v1/experiences/exp_%00",
        "/api/v1/tenant/api-keys/ab%00cd",
        "/api/v1/models/gpt%00",
        "/api/v1/agents/a%001/state",
    ],
)
def test_a_nul_in_a_path_id_is_404_with_the_envelope(make_client, tenant_a, path):
    admin = make_client(tenant_a, ["admin"])
    for method in ("get", "post", "patch", "delete"):
        response = getattr(admin, method)(path, {}, format="json")
        envelope(response, 404, "not_found")


def test_a_nul_in_a_query_parameter_is_422_naming_it(api_a, session_id):
    response = api_a.get(f"/api/v1/sessions/{session_id}/messages?after=%00")
    assert list(envelope(response, 422, "validation_error")["details"]["fields"]) == ["after"]
    response = api_a.get("/api/v1/agents/a1/events?as_agent=a%001")
    envelope(response, 422, "validation_error")


def test_another_tenants_session_is_still_404_and_untouched(api_a, api_b, session_id):
    url = f"/api/v1/sessions/{session_id}/messages"
    body = {"role": "user", "content": "x", "parent_seq": 1}
    envelope(api_b.post(url, body, format="json"), 404, "not_found")
    assert Message.objects.count() == 0


@pytest.mark.parametrize("ref", ["²", "\u0661"])  # digits to str.isdigit; a seq is ASCII digits
def test_a_checkpoint_ref_of_unicode_digits_is_404_not_500(api_a, ref):
    agent_get_or_create(tenant=api_a.api_key.tenant, external_id="a1")
    api_a.post("/api/v1/agents/a1/checkpoints", {"state": {"schema_version": 1}}, format="json")
    envelope(api_a.get(f"/api/v1/agents/a1/checkpoints/{ref}"), 404, "not_found")
    diff = api_a.get("/api/v1/agents/a1/checkpoints/diff", {"from": ref, "to": "1"})
    envelope(diff, 404, "not_found")


@pytest.mark.parametrize("op", [{}, [], 1, None])
def test_a_store_batch_op_that_is_not_a_name_is_422(api_a, op):
    response = api_a.post("/api/v1/store/batch", {"ops": [{"op": op}]}, format="json")
    error = envelope(response, 422, "validation_error")
    assert "ops" in error["details"]["fields"], error


def test_retrying_another_tenants_experience_embedding_is_404(api_a, api_b):
    from memory.models import EmbeddingStatus, Experience

    theirs = api_b.post("/api/v1/experiences", {"problem": "b's lesson"}, format="json").json()["id"]
    Experience.objects.filter(public_id=theirs).update(embedding_status=EmbeddingStatus.FAILED)
    response = api_a.post("/api/v1/experiences/embeddings/retry", {"experiences": [theirs]}, format="json")
    envelope(response, 404, "not_found")
    assert Experience.objects.get(public_id=theirs).embedding_status == EmbeddingStatus.FAILED
    own = api_b.post("/api/v1/experiences/embeddings/retry", {"experiences": [theirs]}, format="json")
    assert own.status_code == 202 and own.json() == {"requeued": 1}, own.content
