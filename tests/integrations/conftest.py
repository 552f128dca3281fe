"""Adapters are tested against a real ctxapp server (uvicorn on the test database), through the
real client, with the real langchain-core / langgraph packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memory.models import Tenant
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server


@pytest.fixture(scope="module")
def server(django_db_setup: None) -> Iterator[str]:
    with uvicorn_server(worker_env()) as base:
        yield base


@pytest.fixture
def alice_key(transactional_db: None) -> str:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    return api_key_create(tenant=tenant, name="adapters")[1]


@pytest.fixture
def bob_key(transactional_db: None) -> str:
    tenant = Tenant.objects.create(name="Bob's team", slug="bob")
    return api_key_create(tenant=tenant, name="adapters")[1]
