"""The OpenAPI schema tells the truth: schemathesis drives every operation in-process and checks it.

Bodies and parameters are generated from the schema (positive mode); path ids and the `agent` /
`session` / `task` fields are pointed at real objects (a session with a key, a task, a checkpoint,
a fact, an experience, the agent) so requests get past 404 into the views. Each request is sent
again with every integer in it at 2^31, 2^63 - 1 or 2^63. Checks: no 5xx, every status is
declared, every body matches the declared schema. Bounded: `MAX_EXAMPLES` per operation, a
per-example deadline, destructive operations last.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.test import APIClient
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from memory.models import Tenant

pytestmark = pytest.mark.django_db

MAX_EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "15"))  # raise it locally to dig deeper
# Positive data by default (bodies valid enough to reach the views); SCHEMATHESIS_MODES=all adds
# schema-violating data as well, for a deeper local run.
MODES = {"positive": [GenerationMode.POSITIVE], "all": [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]}[
    os.environ.get("SCHEMATHESIS_MODES", "positive")
]
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture
def wsgi_app(ids):  # after `ids`: the test client reconnects the signal after each request
    # The test's transaction must survive each request: Django closes "obsolete" connections at
    # the start and end of a request, which inside the test's atomic block means the test connection.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


@pytest.fixture
def ids(make_client) -> dict[str, str]:
    """Real objects of tenant A, named the way the schema's parameters and fields name them."""
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    client: APIClient = make_client(tenant, ["admin"])
    session = client.post(
        "/api/v1/sessions", {"agent": "agent-1", "user_id": "u1", "key": "conv-1"}, format="json"
    ).json()
    client.post(
        f"/api/v1/sessions/{session['id']}/messages",
        {
            "messages": [
                {"role": "user", "content": "Deploy fails on disk full."},
                {"role": "assistant", "content": "Free /var."},
            ]
        },
        format="json",
    )
    task = client.post(
        "/api/v1/tasks", {"agent": "agent-1", "session": session["id"], "title": "t"}, format="json"
    )
    checkpoint = client.post(
        "/api/v1/agents/agent-1/checkpoints", {"state": {"schema_version": 1}}, format="json"
    )
    fact = client.post(
        f"/api/v1/sessions/{session['id']}/facts",
        {"key": "db", "type": "constraint", "content": "PostgreSQL 18"},
        format="json",
    )
    experience = client.post(
        "/api/v1/experiences", {"problem": "disk full", "solution": "free /var"}, format="json"
    )
    values = {
        "agent": "agent-1",
        "session_id": session["id"],
        "session": session["id"],
        "task_id": task.json()["id"],
        "task": task.json()["id"],
        "ref": checkpoint.json()["id"],
        "fact_id": fact.json()["id"],
        "experience_id": experience.json()["id"],
        "prefix": client.api_key.prefix,  # type: ignore[attr-defined]
        "name": "gpt-4o",
        "key": "conv-1",
        "user_id": "u1",
        "authorization": f"Bearer {client.secret}",  # type: ignore[attr-defined]
    }
    assert all(values.values()), values
    return values


BIG_INTEGERS = (2**31, 2**63 - 1, 2**63)  # past an integer column, a bigint's largest, past a bigint


def _with_integers(value: Any, big: int) -> tuple[Any, bool]:
    """`value` with each integer in it (at any depth) replaced by `big`, and whether it had one."""
    if isinstance(value, bool):
        return value, False
    if isinstance(value, int):
        return big, True
    if isinstance(value, dict):
        pairs = {k: _with_integers(v, big) for k, v in value.items()}
        return {k: v for k, (v, _) in pairs.items()}, any(found for _, found in pairs.values())
    if isinstance(value, list):
        items = [_with_integers(v, big) for v in value]
        return [v for v, _ in items], any(found for _, found in items)
    return value, False


def _integers_set(case: Any, big: int) -> bool:
    """Set every integer of the case's query and body to `big`; whether there was one."""
    changed = False
    for name in ("query", "body"):
        container = getattr(case, name)
        if isinstance(container, dict | list):
            value, found = _with_integers(container, big)
            if found:
                setattr(case, name, value)
                changed = True
    return changed


def _destructive(operation: Any) -> bool:
    return operation.method.upper() == "DELETE" or operation.path.endswith("/end")


def test_every_operation_conforms_to_the_schema(ids, wsgi_app) -> None:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    schema = schemathesis.openapi.from_dict(raw)
    operations = [result.ok() for result in schema.get_all_operations()]
    operations.sort(key=_destructive)  # deleting the session first would leave the rest 404
    assert len(operations) >= 60
    failures: list[str] = []
    statuses: dict[str, set[int]] = {}

    for operation in operations:
        label = operation.label

        strategies = [operation.as_strategy(generation_mode=mode) for mode in MODES]

        @given(case=strategies[0] if len(strategies) == 1 else st.one_of(*strategies))
        @hypothesis_settings(
            max_examples=MAX_EXAMPLES,
            deadline=timedelta(seconds=15),
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            for name in list(case.path_parameters or {}):
                case.path_parameters[name] = ids.get(name, case.path_parameters[name])
            for container in (case.query, case.body):
                if isinstance(container, dict):
                    for name in ("agent", "session", "task"):
                        if name in container and isinstance(container[name], str):
                            container[name] = ids[name]
            response = case.call(app=wsgi_app, headers={"Authorization": ids["authorization"]})
            statuses.setdefault(case.operation.label, set()).add(response.status_code)
            case.validate_response(response, checks=CHECKS)
            # The same request with every integer at a PostgreSQL bound or past it: 4xx, never 500.
            big = BIG_INTEGERS[len(statuses[case.operation.label]) % len(BIG_INTEGERS)]
            if _integers_set(case, big):
                response = case.call(app=wsgi_app, headers={"Authorization": ids["authorization"]})
                case.validate_response(response, checks=CHECKS)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:
            text = re.sub(r"\s+", " ", str(exc))
            failures.append(f"{label}: {text[:1500]}")

    assert not failures, "\n\n".join(failures)
    # The run got past authentication and validation: most operations answered a 2xx at least once.
    succeeded = [label for label, seen in statuses.items() if any(200 <= s < 300 for s in seen)]
    assert len(succeeded) >= len(operations) * 0.6, sorted(set(statuses) - set(succeeded))
