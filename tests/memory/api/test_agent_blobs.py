"""PUT/GET /api/v1/agents/{agent}/blobs/{sha256}: large values kept beside an agent's checkpoints
and events, by the SHA-256 of their bytes (CtxappSaver's large LangGraph values)."""

from __future__ import annotations

import base64
import hashlib

import pytest
from rest_framework.test import APIClient

from memory.models import AgentBlob, Tenant
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db

DATA = bytes(range(256)) * 4096  # 1 MiB
DIGEST = hashlib.sha256(DATA).hexdigest()
BODY = {"base64": base64.b64encode(DATA).decode()}


def _agent(api: APIClient, name: str = "bot") -> None:
    assert api.post(f"/api/v1/agents/{name}/events", {"type": "agent.note"}, format="json").status_code == 201


def test_a_blob_is_stored_once_under_its_digest_and_read_back(api_a: APIClient) -> None:
    _agent(api_a)
    first = api_a.put(f"/api/v1/agents/bot/blobs/{DIGEST}", BODY, format="json")
    assert first.status_code == 201 and first.json()["size"] == len(DATA) and first.json()["sha256"] == DIGEST
    again = api_a.put(f"/api/v1/agents/bot/blobs/{DIGEST}", BODY, format="json")
    assert again.status_code == 200 and AgentBlob.objects.count() == 1  # the same bytes: nothing written
    read = api_a.get(f"/api/v1/agents/bot/blobs/{DIGEST}")
    assert read.status_code == 200 and base64.b64decode(read.json()["base64"]) == DATA
    assert api_a.delete("/api/v1/agents/bot").status_code in (200, 204)
    assert not AgentBlob.objects.exists()  # gone with its agent


def test_bad_blobs_are_refused_and_nothing_is_stored(api_a: APIClient) -> None:
    _agent(api_a)
    wrong = api_a.put(f"/api/v1/agents/bot/blobs/{'0' * 64}", BODY, format="json")
    assert wrong.status_code == 422 and "base64" in wrong.json()["error"]["details"]["fields"]
    not_hex = api_a.put("/api/v1/agents/bot/blobs/nothex", BODY, format="json")
    assert not_hex.status_code == 422 and "sha256" in not_hex.json()["error"]["details"]["fields"]
    not_b64 = api_a.put(f"/api/v1/agents/bot/blobs/{DIGEST}", {"base64": "%%%"}, format="json")
    assert not_b64.status_code == 422 and "base64" in not_b64.json()["error"]["details"]["fields"]
    extra = api_a.put(f"/api/v1/agents/bot/blobs/{DIGEST}", {**BODY, "size": 3}, format="json")
    assert extra.status_code == 422
    assert api_a.put(f"/api/v1/agents/nobody/blobs/{DIGEST}", BODY, format="json").status_code == 404
    assert api_a.get(f"/api/v1/agents/bot/blobs/{DIGEST}").status_code == 404
    assert not AgentBlob.objects.exists()


def test_another_tenant_and_another_agents_key_do_not_reach_a_blob(
    api_a: APIClient, api_b: APIClient, tenant_a: Tenant
) -> None:
    _agent(api_a)
    _agent(api_a, "other")
    assert api_a.put(f"/api/v1/agents/bot/blobs/{DIGEST}", BODY, format="json").status_code == 201
    assert api_b.get(f"/api/v1/agents/bot/blobs/{DIGEST}").status_code == 404
    assert api_b.put(f"/api/v1/agents/bot/blobs/{DIGEST}", BODY, format="json").status_code == 404
    assert api_a.get(f"/api/v1/agents/other/blobs/{DIGEST}").status_code == 404  # kept per agent
    _, secret = api_key_create(tenant=tenant_a, name="bound", agent_external_id="other")
    bound = APIClient()
    bound.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    refused = bound.get(f"/api/v1/agents/bot/blobs/{DIGEST}")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "agent_mismatch"
    reader = APIClient()
    reader.credentials(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(tenant=tenant_a, name='r', scopes=['read'])[1]}"
    )
    assert reader.put(f"/api/v1/agents/bot/blobs/{DIGEST}", BODY, format="json").status_code == 403
    assert reader.get(f"/api/v1/agents/bot/blobs/{DIGEST}").status_code == 200
