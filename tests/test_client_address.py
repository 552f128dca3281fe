"""The client address under the server `ctxapp web` runs: a forwarded header sent by the client
itself must not pick the address that auth-failure throttles count against."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from django.conf import settings

from ctxapp.cli.processes import web_argv
from memory.models import Tenant
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def server_env(**overrides: str) -> dict[str, str]:
    """The test server's environment, with a cache of its own: the rate limits' counters for
    127.0.0.1 start at zero, whatever earlier tests of the run counted against that address."""
    return {
        **worker_env(),
        "CTXAPP_QUEUE_PREFIX": f"{settings.QUEUE_PREFIX}-addr-{uuid.uuid4().hex[:8]}",
        **overrides,
    }


def _ctxapp_web(port: int) -> list[str]:
    """The command line `ctxapp web` runs (its proxy-header handling is what is under test)."""
    return web_argv(settings.CTXAPP, "127.0.0.1", port)


def test_forwarded_header_is_not_believed_without_proxies(transactional_db: None) -> None:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    _, good_key = api_key_create(tenant=tenant, name="good")
    env = server_env(CTXAPP_THROTTLE_AUTH_FAILURE_RATE="3/min", CTXAPP_NUM_PROXIES="0")

    with uvicorn_server(env, argv=_ctxapp_web) as base:
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


def _login_status(client: httpx.Client, base: str, password: str, forwarded: str) -> int:
    """Post the dashboard's login form as a browser does (its CSRF token first)."""
    form = client.get(f"{base}/login/")
    token = client.cookies["csrftoken"]
    assert form.status_code == 200
    response = client.post(
        f"{base}/login/",
        data={"username": "carol", "password": password, "csrfmiddlewaretoken": token},
        headers={"X-Forwarded-For": forwarded, "Referer": f"{base}/login/"},
    )
    return response.status_code


def test_forwarded_header_does_not_escape_a_login_lockout(transactional_db: None) -> None:
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user(username="carol", password="right-password", is_staff=True)
    env = server_env(CTXAPP_NUM_PROXIES="0", CTXAPP_LOGIN_FAILURE_LIMIT="3")

    with uvicorn_server(env, argv=_ctxapp_web) as base, httpx.Client() as client:
        wrong = [_login_status(client, base, "wrong", f"9.9.8.{n}") for n in range(4)]
        # Each wrong password from a "new" forwarded address still counts against the socket's.
        assert wrong[:2] == [200, 200], wrong
        assert wrong[2:] == [429, 429], wrong
        assert _login_status(client, base, "right-password", "7.7.7.7") == 429


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (0, "9.9.9.9", "127.0.0.1"),
        (1, "9.9.9.9", "9.9.9.9"),
        (1, "6.6.6.6, 9.9.9.9", "9.9.9.9"),
        (2, "6.6.6.6, 9.9.9.9, 10.0.0.2", "9.9.9.9"),
        (2, "1.1.1.1, 6.6.6.6, 9.9.9.9, 10.0.0.2", "9.9.9.9"),
        (3, "9.9.9.9, 10.0.0.2", "9.9.9.9"),  # fewer hops than proxies: the outermost one recorded
    ],
)
def test_with_n_proxies_only_the_nth_entry_from_the_right_counts(
    settings: Any, proxies: int, forwarded: str, expected: str
) -> None:
    from dataclasses import replace

    from django.test import RequestFactory

    from memory.api.throttles import client_address

    settings.CTXAPP = replace(settings.CTXAPP, num_proxies=proxies)
    request = RequestFactory().get("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


def test_behind_one_proxy_a_client_chosen_prefix_does_not_escape_the_lockout(transactional_db: None) -> None:
    tenant = Tenant.objects.create(name="Bob's team", slug="bob")
    _, good_key = api_key_create(tenant=tenant, name="good")
    env = server_env(CTXAPP_THROTTLE_AUTH_FAILURE_RATE="3/min", CTXAPP_NUM_PROXIES="1")

    with uvicorn_server(env, argv=_ctxapp_web) as base:
        # The proxy appends the address it saw (203.0.113.5); the client rotates what it prepends.
        statuses = [
            httpx.get(
                f"{base}/api/v1/tenant",
                headers={"Authorization": "Bearer wrong-key", "X-Forwarded-For": f"9.9.9.{n}, 203.0.113.5"},
            ).status_code
            for n in range(5)
        ]
        assert statuses == [401, 401, 401, 429, 429], statuses
        # Another client behind the same proxy is not locked out.
        other = httpx.get(
            f"{base}/api/v1/tenant",
            headers={"Authorization": f"Bearer {good_key}", "X-Forwarded-For": "203.0.113.6"},
        )
        assert other.status_code == 200
