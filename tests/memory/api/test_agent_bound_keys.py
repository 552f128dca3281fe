"""A key bound to an agent always acts as that agent: another agent's private layers are out of reach.

Without binding, the X-Agent-Id header names the calling agent and anyone holding the tenant's key
may name any agent; binding turns that claim into something the key proves.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from memory.models import ApiKey, PrivateContext
from memory.services.sessions import agent_get_or_create, task_create
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db

SECRET = "A-ONLY-91be"


@pytest.fixture
def task_id(tenant_a, api_a):
    for name in ("agent-a", "agent-b"):
        agent_get_or_create(tenant=tenant_a, external_id=name)
    task = task_create(tenant=tenant_a, agent_external_id="agent-a", title="shared work")
    response = api_a.put(
        f"/api/v1/tasks/{task.public_id}/private-context",
        {"data": {"secret": SECRET}},
        format="json",
        HTTP_X_AGENT_ID="agent-a",
    )
    assert response.status_code == 200
    return task.public_id


@pytest.fixture
def key_of_b(tenant_a):
    from rest_framework.test import APIClient

    _, secret = api_key_create(tenant=tenant_a, name="agent b", agent_external_id="agent-b")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_a_bound_key_cannot_claim_another_agent(key_of_b, task_id):
    url = f"/api/v1/tasks/{task_id}/private-context"
    for kwargs in ({"HTTP_X_AGENT_ID": "agent-a"}, {}):
        path = url if kwargs else f"{url}?as_agent=agent-a"
        response = key_of_b.get(path, **kwargs)
        assert response.status_code == 403, response.content
        error = response.json()["error"]
        assert error["code"] == "agent_mismatch"
        assert error["details"] == {"bound_agent": "agent-b", "requested_agent": "agent-a"}
        assert SECRET not in response.content.decode()
    refused = key_of_b.get(f"/api/v1/agents/agent-a/context-view?task={task_id}")
    assert refused.status_code == 403 and SECRET not in refused.content.decode()


def test_a_bound_key_acts_as_its_agent_without_a_header(key_of_b, task_id, api_a):
    url = f"/api/v1/tasks/{task_id}/private-context"
    outsider = key_of_b.put(url, {"data": {"plan": "B's plan"}}, format="json")
    assert outsider.status_code == 403, outsider.content  # B takes no part in A's task yet
    invited = api_a.post(
        f"/api/v1/tasks/{task_id}/messages", {"to": "agent-b", "body": "join"}, format="json",
        HTTP_X_AGENT_ID="agent-a",
    )  # fmt: skip
    assert invited.status_code == 201, invited.content
    written = key_of_b.put(url, {"data": {"plan": "B's plan"}}, format="json")
    assert written.status_code == 200, written.content
    assert key_of_b.get(url).json()["data"] == {"plan": "B's plan"}
    stored = {
        p.agent.external_id: json.loads(p.document) for p in PrivateContext.objects.select_related("agent")
    }
    assert stored == {"agent-a": {"secret": SECRET}, "agent-b": {"plan": "B's plan"}}
    recovered = key_of_b.get("/api/v1/agents/agent-a/recovered-state").content.decode()
    assert SECRET not in recovered


def test_keys_are_bound_through_the_api_the_admin_command_and_show_it(make_client, tenant_a, capsys):
    admin = make_client(tenant_a, ["admin"])
    created = admin.post("/api/v1/tenant/api-keys", {"name": "worker", "agent": "agent-b"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["agent"] == "agent-b"
    assert ApiKey.objects.get(prefix=created.json()["prefix"]).agent_external_id == "agent-b"
    call_command("create_api_key", tenant=tenant_a.slug, agent="agent-c")
    assert ApiKey.objects.filter(agent_external_id="agent-c").count() == 1
    listed = admin.get("/api/v1/tenant/api-keys").json()["items"]
    assert {item["agent"] for item in listed} >= {"agent-b", "agent-c", ""}
