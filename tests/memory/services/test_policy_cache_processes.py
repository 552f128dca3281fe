"""Per-tenant configuration read once, with two web processes: a policy changed through one process's
API, through the admin's way (an ORM save in another process) or by a migration is what the other
process serves on its very next request (memory/models/policy_cache.py)."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.core.management.sql import emit_post_migrate_signal

from ctxapp.cli.processes import web_argv
from memory.models import SharingPolicy, Tenant
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/tenant/policies/sharing"


def _ctxapp_web(port: int) -> list[str]:
    return web_argv(settings.CTXAPP, "127.0.0.1", port)


def _shares_messages(client: httpx.Client, base: str) -> bool:
    response = client.get(f"{base}{PATH}", timeout=30)
    assert response.status_code == 200, response.text
    return bool(response.json()["share_messages"])


def test_every_process_sees_a_policy_change_at_once(transactional_db: Any) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, secret = api_key_create(tenant=tenant, name="admin", scopes=["admin"])
    with ExitStack() as stack:
        a = stack.enter_context(uvicorn_server(worker_env(), argv=_ctxapp_web))
        b = stack.enter_context(uvicorn_server(worker_env(), argv=_ctxapp_web))
        client = stack.enter_context(httpx.Client(headers={"Authorization": f"Bearer {secret}"}))
        assert not _shares_messages(client, b)  # B has read the row

        # B serves the row from memory: a change that bypasses Django (raw SQL, no new version)
        # is not seen — which is what makes every change below a test of the version.
        SharingPolicy.objects.filter(tenant=tenant).update(share_messages=True)
        assert not _shares_messages(client, b)
        SharingPolicy.objects.filter(tenant=tenant).update(share_messages=False)

        # Through A's API.
        changed = client.patch(f"{a}{PATH}", json={"share_messages": True}, timeout=30)
        assert changed.status_code == 200, changed.text
        assert _shares_messages(client, b)

        # The admin's way: a model save, in another process (this one).
        policy = SharingPolicy.objects.get(tenant=tenant)
        policy.share_messages = False
        policy.save()
        assert not _shares_messages(client, b)
        assert not _shares_messages(client, a)

        # A migration: rows changed without signals (historical models), then post_migrate, as
        # `migrate` sends it after applying migrations.
        SharingPolicy.objects.filter(tenant=tenant).update(share_messages=True)
        emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
        assert _shares_messages(client, b)
        assert _shares_messages(client, a)
