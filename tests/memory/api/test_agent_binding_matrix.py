"""A key bound to agent B can name, read or change nothing of agent A: a matrix over the OpenAPI schema.

Every operation of the schema is enumerated. One that names an agent, a session or a task (in its
path, a query parameter or a body field) is tried once per place it names one: that place names
agent A's object, every other place names B's own, and B's bound key must get 403
`agent_mismatch` while A's own bound key, doing the same to A's object, must not. An operation
that names none must be listed below as agent-independent, with the reason; an operation that
names one but is exempt must say why. A new route therefore fails this test until it is placed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from memory.models import Experience, Session, Task, Tenant
from memory.services.experiences import experience_create
from memory.services.sessions import session_create, task_create
from memory.services.tenancy import api_key_create

BINDING_NAMES = {"agent": "agent", "session_id": "session", "task_id": "task"}  # path parameter → kind
BINDING_FIELDS = ("agent", "session", "task")  # query parameters and body fields

# Operations that name no agent, session or task: what they touch is the tenant's, not an agent's.
AGENT_INDEPENDENT = {
    "v1_experiences_retrieve": "names only the experience; a bound key reads only its own agent's "
    "(test_a_bound_key_cannot_read_or_change_another_agents_experience)",
    "v1_experiences_embeddings_retry_create": "names only experiences: a bound key re-queues only its own "
    "agent's, another's id answers 404 (test_agent_access_matrix.py)",
    "v1_models_list": "the model profile table is global",
    "v1_models_retrieve": "the model profile table is global",
    "v1_tenant_retrieve": "describes the tenant",
    "v1_tenant_api_keys_list": "key management (admin scope), not an agent's data",
    "v1_tenant_api_keys_retrieve": "key management (admin scope), not an agent's data",
    "v1_tenant_api_keys_destroy": "key management (admin scope), not an agent's data",
    "v1_tokens_count_create": "pure computation, touches nothing stored",
    "v1_experiences_destroy": "names only the experience; a bound key deletes only its own agent's "
    "(test_a_bound_key_cannot_read_or_change_another_agents_experience)",
    "v1_memory_index_retrieve": "the indexing progress of the tenant's memory, no agent's data",
    "v1_memory_search_create": "names agents only inside `scope`; a bound key's search reads only its "
    "own agent's rows of every kind (test_agent_access_matrix.py)",
    "v1_tenant_policies_experiences_retrieve": "tenant policy (admin scope), not an agent's data",
    "v1_tenant_policies_experiences_partial_update": "tenant policy (admin scope), not an agent's data",
    "v1_tenant_policies_sharing_retrieve": "tenant policy (admin scope), not an agent's data",
    "v1_tenant_policies_sharing_partial_update": "tenant policy (admin scope), not an agent's data",
    "v1_traces_create": "OTLP ingest: a bound key records every span as its own agent (test_otel.py)",
    "v1_store_batch_create": "the key-value store: a bound key has its own (test_langgraph_store.py)",
    "v1_agents_list": "names no agent; a bound key lists only its own (test_session_keys.py)",
    "v1_users_destroy": "names only the user; a bound key forgets only its own agent's sessions of the "
    "user (test_forget.py, test_a_bound_key_forgets_only_its_agents_sessions_of_the_user)",
}

# A user is not an agent's: a bound key reaches a user of its own agent's sessions only, and every
# other user answers 404 as an unknown one does (tests/memory/api/test_user_memories.py).
USER_MEMORY_REASON = (
    "names only a user; a bound key reaches only users of its agent's sessions (404 otherwise), and "
    "only its agent's memories of them (test_agent_access_matrix.py)"
)
USER_MEMORY_OPERATIONS = ("list", "create", "retrieve", "partial_update", "destroy")
AGENT_INDEPENDENT |= {f"v1_users_memories_{op}": USER_MEMORY_REASON for op in USER_MEMORY_OPERATIONS}
AGENT_INDEPENDENT["v1_users_memories_history_retrieve"] = USER_MEMORY_REASON

# Operations that name a task but act as the calling agent on layers the task's agents share by
# design: the key's agent is the caller (X-Agent-Id naming another agent is refused instead), and
# only while it takes part in the task (memory/services/agent_access.py; every route and MCP tool
# against another agent's objects: test_agent_access_matrix.py).
SHARED_BETWEEN_AGENTS = {
    "v1_tasks_shared_context_retrieve": "the task's shared context is read by every agent on the task",
    "v1_tasks_shared_context_update": "the task's shared context is written by every agent on the task",
    "v1_tasks_shared_context_partial_update": "the task's shared context is written by every agent on it",
    "v1_tasks_private_context_retrieve": "answers the caller's own private context only",
    "v1_tasks_private_context_update": "writes the caller's own private context only",
    "v1_tasks_messages_list": "lists messages to or from the caller only",
    "v1_tasks_messages_create": "sends as the caller",
    "v1_tasks_messages_read_create": "marks the caller's own receipts",
}

# Bodies that pass validation, for the shared layers (they validate before naming the caller).
VALID_BODIES = {
    "v1_tasks_messages_create": {"body": "hello"},
    "v1_tasks_messages_read_create": {"ids": []},
    "v1_tasks_private_context_update": {"data": {}},
}


@dataclass
class Operation:
    operation_id: str
    method: str
    path: str
    path_params: list[str]
    query_params: list[str]
    header_params: list[str]
    body_fields: list[str]
    places: list[tuple[str, str]] = field(default_factory=list)  # (where, name) that name an agent

    def __str__(self) -> str:
        return self.operation_id


def _operations() -> list[Operation]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    operations = []
    for path, item in schema["paths"].items():
        for method, op in item.items():
            params = op.get("parameters", [])
            body = (
                op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema") or {}
            )
            if "$ref" in body:
                body = components[body["$ref"].rsplit("/", 1)[-1]]
            operation = Operation(
                operation_id=op["operationId"],
                method=method,
                path=path,
                path_params=[p["name"] for p in params if p["in"] == "path"],
                query_params=[p["name"] for p in params if p["in"] == "query"],
                header_params=[p["name"] for p in params if p["in"] == "header"],
                body_fields=list(body.get("properties", {})),
            )
            operation.places = (
                [("path", name) for name in operation.path_params if name in BINDING_NAMES]
                + [("query", name) for name in operation.query_params if name in BINDING_FIELDS]
                + [("body", name) for name in operation.body_fields if name in BINDING_FIELDS]
            )
            operations.append(operation)
    return operations


OPERATIONS = _operations()


@dataclass
class World:
    objects: dict[str, dict[str, str]]  # agent → kind → id
    keys: dict[str, APIClient]  # agent → its bound key's client


@pytest.fixture
def world(db: None) -> World:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    objects, keys = {}, {}
    for agent in ("agent-a", "agent-b"):
        session: Session = session_create(tenant=tenant, agent_external_id=agent)
        task: Task = task_create(tenant=tenant, session=session, agent_external_id=agent, title="work")
        objects[agent] = {"agent": agent, "session": session.public_id, "task": task.public_id}
        _, secret = api_key_create(tenant=tenant, name=agent, scopes=["admin"], agent_external_id=agent)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        keys[agent] = client
    return World(objects, keys)


def _request(world: World, op: Operation, *, key: str, target: str, place: tuple[str, str] | None) -> Any:
    """`key`'s client calls `op`; `place` names `target`'s object, every other place the key's own."""

    def value(where: str, name: str) -> str:
        kind = BINDING_NAMES.get(name, name) if where == "path" else name
        owner = target if place is None or place == (where, name) else key
        return world.objects[owner][kind]

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        return value("path", name) if name in BINDING_NAMES else "x"

    path = re.sub(r"\{(\w+)\}", fill, op.path)
    query = {name: value("query", name) for where, name in op.places if where == "query"}
    body = {name: value("body", name) for where, name in op.places if where == "body"}
    client = world.keys[key]
    if op.method == "get":
        return client.get(path, query)
    return getattr(client, op.method)(path + (f"?{urlencode(query)}" if query else ""), body, format="json")


def _is_mismatch(response: Any) -> bool:
    return response.status_code == 403 and response.json()["error"]["code"] == "agent_mismatch"


def test_every_operation_is_placed() -> None:
    unplaced = [
        op.operation_id for op in OPERATIONS if not op.places and op.operation_id not in AGENT_INDEPENDENT
    ]
    assert not unplaced, f"operations neither checked nor listed as agent-independent: {unplaced}"
    known = {op.operation_id for op in OPERATIONS}
    stale = (set(AGENT_INDEPENDENT) | set(SHARED_BETWEEN_AGENTS)) - known
    assert not stale, f"listed operations that are no longer in the schema: {stale}"
    assert all(reason for reason in {**AGENT_INDEPENDENT, **SHARED_BETWEEN_AGENTS}.values())
    naming = [op.operation_id for op in OPERATIONS if op.places and op.operation_id in AGENT_INDEPENDENT]
    assert not naming, f"listed as agent-independent but they name an agent, session or task: {naming}"


CHECKED = [
    pytest.param(op, place, id=f"{op.operation_id}-{place[0]}.{place[1]}")
    for op in OPERATIONS
    if op.operation_id not in SHARED_BETWEEN_AGENTS
    for place in op.places
]


@pytest.mark.parametrize(("op", "place"), CHECKED)
def test_a_key_bound_to_b_cannot_touch_a_through_any_operation(world: World, op: Operation, place) -> None:
    refused = _request(world, op, key="agent-b", target="agent-a", place=place)
    assert _is_mismatch(refused), (op.method, op.path, place, refused.status_code, refused.content)
    assert refused.json()["error"]["details"] == {"bound_agent": "agent-b", "requested_agent": "agent-a"}
    own = _request(world, op, key="agent-a", target="agent-a", place=place)
    assert not _is_mismatch(own), (op.method, op.path, place, own.content)
    assert own.status_code < 500, own.content


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.operation_id in SHARED_BETWEEN_AGENTS], ids=str)
def test_shared_task_layers_act_as_the_key_agent_and_refuse_naming_another(
    world: World, op: Operation
) -> None:
    # The task is A's; B takes no part in it until A sends it a message there, then works on it
    # as itself. Naming A as the caller is refused.
    client = world.keys["agent-b"]
    task = world.objects["agent-a"]["task"]
    path = re.sub(r"\{task_id\}", task, op.path)
    outsider = getattr(client, op.method)(path, {} if op.method == "get" else None, format="json")
    assert _is_mismatch(outsider), outsider.content
    invited = world.keys["agent-a"].post(
        f"/api/v1/tasks/{task}/messages", {"to": "agent-b", "body": "join me"}, format="json"
    )
    assert invited.status_code == 201, invited.content
    as_b = getattr(client, op.method)(path, {} if op.method == "get" else None, format="json")
    assert not _is_mismatch(as_b) and as_b.status_code < 500, as_b.content
    if "X-Agent-Id" in op.header_params:
        body = VALID_BODIES.get(op.operation_id)
        as_a = getattr(client, op.method)(path, body, format="json", HTTP_X_AGENT_ID="agent-a")
        assert _is_mismatch(as_a), as_a.content


def test_an_unbound_key_still_acts_for_any_agent(world: World, make_client) -> None:
    tenant = Tenant.objects.get(slug="alice")
    client = make_client(tenant)
    a = world.objects["agent-a"]
    response = client.post(
        f"/api/v1/sessions/{a['session']}/messages", {"role": "user", "content": "hi"}, format="json"
    )
    assert response.status_code == 201, response.content
    response = client.put("/api/v1/agents/agent-b/state", {"schema_version": 1}, format="json")
    assert response.status_code == 200, response.content


def test_another_tenants_session_is_404_not_403_for_a_bound_key(world: World) -> None:
    other = Tenant.objects.create(name="Bob's team", slug="bob")
    session = session_create(tenant=other, agent_external_id="agent-a")
    response = world.keys["agent-b"].post(
        f"/api/v1/sessions/{session.public_id}/messages", {"role": "user", "content": "x"}, format="json"
    )
    assert response.status_code == 404, response.content


# --- lists and experiences: what a bound key sees without naming any agent ------------------


def _experience(agent: str, text: str) -> str:
    tenant = Tenant.objects.get(slug="alice")
    return experience_create(tenant=tenant, problem=text, solution="fix", agent=agent).experience.public_id


@pytest.mark.parametrize("path", ["/api/v1/sessions", "/api/v1/tasks", "/api/v1/experiences"])
def test_a_bound_keys_unfiltered_list_holds_only_its_own_agents_rows(world: World, path: str) -> None:
    own, other = _experience("agent-b", "b's own lesson"), _experience("agent-a", "a's secret lesson")
    response = world.keys["agent-b"].get(path)
    assert response.status_code == 200, response.content
    ids = {item["id"] for item in response.json()["items"]}
    b, a = world.objects["agent-b"], world.objects["agent-a"]
    expected = {"/api/v1/sessions": (b["session"], a["session"]), "/api/v1/tasks": (b["task"], a["task"])}
    mine, theirs = expected.get(path, (own, other))
    assert mine in ids and theirs not in ids, ids
    assert "secret" not in response.content.decode()


def test_a_bound_key_cannot_read_or_change_another_agents_experience(world: World) -> None:
    other = _experience("agent-a", "a's secret lesson")
    client = world.keys["agent-b"]
    calls = {
        "get": client.get(f"/api/v1/experiences/{other}"),
        "feedback": client.post(f"/api/v1/experiences/{other}/feedback", {"helpful": False}, format="json"),
        "delete": client.delete(f"/api/v1/experiences/{other}"),
    }
    for name, response in calls.items():
        assert response.status_code == 404, (name, response.content)
        assert response.json()["error"]["code"] == "not_found"
    # Nothing changed: A still reads its experience, with no feedback recorded.
    own = world.keys["agent-a"].get(f"/api/v1/experiences/{other}")
    assert own.status_code == 200, own.content
    assert Experience.objects.get(public_id=other).feedback.count() == 0
    assert world.keys["agent-a"].delete(f"/api/v1/experiences/{other}").status_code == 204


def test_a_bound_keys_experience_search_finds_only_its_own_agents(world: World) -> None:
    _experience("agent-a", "deploy fails with a secret database password leak")
    _experience("agent-b", "deploy fails when the cache is cold")
    response = world.keys["agent-b"].post(
        "/api/v1/experiences/search", {"query": "deploy fails"}, format="json"
    )
    assert response.status_code == 200, response.content
    texts = " ".join(str(hit) for hit in response.json()["results"])
    assert "cache is cold" in texts and "secret" not in texts
    named = world.keys["agent-b"].post(
        "/api/v1/experiences/search", {"query": "deploy", "agent": "agent-a"}, format="json"
    )
    assert _is_mismatch(named), named.content
