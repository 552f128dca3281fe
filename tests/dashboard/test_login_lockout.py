"""Failed logins lock out a username from an address (django-axes), on the dashboard and the admin."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.dashboard.conftest import PASSWORD

pytestmark = pytest.mark.django_db

LIMIT = 3


@pytest.fixture(autouse=True)
def low_limit(settings):
    settings.AXES_FAILURE_LIMIT = LIMIT  # the suite's settings raise it out of reach


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_too_many_failures_lock_the_username_out_of_that_address(carol, url):
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT - 1):
        response = client.post(url, {"username": "carol", "password": "wrong"})
        assert response.status_code == 200  # the form again, with its error
    locked = client.post(url, {"username": "carol", "password": "wrong"})
    assert locked.status_code == 429
    assert b"Too many failed logins" in locked.content
    # Locked: even the right password is refused now, and the session stays anonymous.
    again = client.post(url, {"username": "carol", "password": PASSWORD})
    assert again.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another address, or another username from this address, is not locked.
    elsewhere = Client(REMOTE_ADDR="198.51.100.9").post(url, {"username": "carol", "password": PASSWORD})
    assert elsewhere.status_code == 302


def test_a_successful_login_resets_the_count(carol):
    client = Client(REMOTE_ADDR="203.0.113.8")
    for _ in range(LIMIT - 1):
        client.post("/login/", {"username": "carol", "password": "wrong"})
    assert client.post("/login/", {"username": "carol", "password": PASSWORD}).status_code == 302
    client.logout()
    for _ in range(LIMIT - 1):
        assert client.post("/login/", {"username": "carol", "password": "wrong"}).status_code == 200
