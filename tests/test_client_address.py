"""The client address under the server `ctxapp web` runs: a forwarded header sent by the client
itself must not pick the address that auth-failure throttles count against."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from ctxapp.cli.processes import web_argv
from memory.models import Tenant
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_forwarded_header_is_not_believed_without_proxies(transactional_db: None) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, good_key = api_key_create(tenant=tenant, name="good")
    env = {**worker_env(), "CTXAPP_THROTTLE_AUTH_FAILURE_RATE": "3/min", "CTXAPP_NUM_PROXIES": "0"}

    def argv(port: int) -> list[str]:
        return web_argv(settings.CTXAPP, "127.0.0.1", port)

    with uvicorn_server(env, argv=argv) as base:
        statuses = []
        for n in range(6):
            response = httpx.get(
                f"{base}/api/v1/tenant",
                headers={"Authorization": "Bearer wrong-key", "X-Forwarded-For": f"9.9.9.{n}"},
            )
            statuses.append(response.status_code)
        assert statuses[:3] == [401, 401, 401]
        assert statuses[3:] == [429, 429, 429], statuses
        locked_out = httpx.get(
            f"{base}/api/v1/tenant",
            headers={"Authorization": f"Bearer {good_key}", "X-Forwarded-For": "8.8.8.8"},
        )
        assert locked_out.status_code == 429
