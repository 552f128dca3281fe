"""Adapters are tested against a real ctxapp server (uvicorn on the test database), through the
real client, with the real langchain-core / langgraph packages."""

from __future__ import annotations

import pytest

from memory.models import Tenant
from memory.services.tenancy import api_key_create


@pytest.fixture
def server(web_server: str) -> str:
    return web_server


@pytest.fixture
def alice_key(transactional_db: None) -> str:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    return api_key_create(tenant=tenant, name="adapters")[1]


@pytest.fixture
def bob_key(transactional_db: None) -> str:
    tenant = Tenant.objects.create(name="Bob's team", slug="bob")
    return api_key_create(tenant=tenant, name="adapters")[1]
