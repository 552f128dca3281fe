"""API rate limits: per key, per client address, and floods of invalid keys; 429 with Retry-After."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def rates(settings):
    """Lower the limits for one test (the suite's own settings raise them far out of reach)."""

    def set_rates(**rates: str) -> None:
        settings.CTXAPP = dataclasses.replace(
            settings.CTXAPP, **{f"throttle_{name}_rate": rate for name, rate in rates.items()}
        )

    return set_rates


@pytest.fixture
def address() -> str:
    """A client address of this test alone: the counters live in the shared cache."""
    return f"10.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"


def assert_throttled(response) -> None:
    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(response["Retry-After"]) <= 60


def test_a_key_over_its_rate_gets_429_with_retry_after_and_others_are_unaffected(
    api_a, api_b, rates, address
):
    rates(key="3/min")
    for _ in range(3):
        assert api_a.get("/api/v1/sessions", REMOTE_ADDR=address).status_code == 200
    assert_throttled(api_a.get("/api/v1/sessions", REMOTE_ADDR=address))
    written = api_a.post("/api/v1/sessions", {"agent": "a1"}, format="json", REMOTE_ADDR=address)
    assert_throttled(written)
    assert api_b.get("/api/v1/sessions", REMOTE_ADDR=address).status_code == 200  # another key: its own count


def test_an_address_over_its_rate_gets_429_whatever_key_it_uses(api_a, api_b, rates, address):
    rates(address="4/min")
    for client in (api_a, api_b, api_a, api_b):
        assert client.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 200
    assert_throttled(api_b.get("/api/v1/tenant", REMOTE_ADDR=address))
    assert api_b.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 200


def test_a_flood_of_invalid_keys_from_one_address_turns_into_429(anon, api_a, rates, address):
    rates(auth_failure="5/min")
    for index in range(5):
        anon.credentials(HTTP_AUTHORIZATION=f"Bearer ctx_guess{index}_secret")
        assert anon.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 401
    assert_throttled(anon.get("/api/v1/tenant", REMOTE_ADDR=address))
    # From then on even a valid key from that address waits; another address is not affected.
    assert_throttled(api_a.get("/api/v1/tenant", REMOTE_ADDR=address))
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 200


def test_a_spoofed_forwarded_for_does_not_escape_the_address_limit(anon, rates, address):
    rates(auth_failure="2/min")
    for index in range(3):
        response = anon.get("/api/v1/tenant", REMOTE_ADDR=address, HTTP_X_FORWARDED_FOR=f"192.0.2.{index}")
    assert_throttled(response)


def test_rates_are_validated_settings():
    from ctxapp.conf import SettingError, resolve_all

    assert resolve_all({"CTXAPP_THROTTLE_KEY_RATE": "off"})["CTXAPP_THROTTLE_KEY_RATE"].value is None
    with pytest.raises(SettingError, match="CTXAPP_THROTTLE_KEY_RATE"):
        resolve_all({"CTXAPP_THROTTLE_KEY_RATE": "lots"})


def test_every_limit_of_a_request_is_counted(api_a, rates, address):
    rates(key="2/min", address="3/min")
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 200
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 200
    assert_throttled(api_a.get("/api/v1/tenant", REMOTE_ADDR=address))  # the key's limit (2)
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 429  # key still over
    rates(key="100/min")
    assert_throttled(api_a.get("/api/v1/tenant", REMOTE_ADDR=address))  # now the address's (3)
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 200


def test_an_unreachable_cache_fails_open(settings, api_a, rates, address):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
        }
    }
    rates(key="1/min", address="1/min", auth_failure="1/min")
    for _ in range(3):
        assert api_a.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 200


def test_the_counts_live_in_the_cache_through_its_public_api(address):
    from django.core.cache import cache

    from memory.api.throttles import window_counts, window_peek

    keys = [(f"key:{address}", 60), (f"address:{address}", 60)]
    assert [count for count, _ in window_counts(keys)] == [1, 1]
    assert [count for count, _ in window_counts(keys)] == [2, 2]
    assert window_peek(f"key:{address}", 60)[0] == 2
    assert sum(int(value) for value in cache.get_many(cache_keys(address, "key", "address")).values()) == 4


def test_the_limits_apply_on_any_django_cache_backend(settings, api_a, rates, address):
    """Local memory has no raw client nor table: only Django's cache API can count there."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    rates(key="2/min")
    for _ in range(2):
        assert api_a.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 200
    assert_throttled(api_a.get("/api/v1/tenant", REMOTE_ADDR=address))


def test_the_throttles_do_not_reach_into_a_cache_backend():
    import inspect

    from memory.api import throttles

    source = inspect.getsource(throttles)
    assert "._cache" not in source and "ctxapp_cache" not in source and "cursor" not in source


# --- the failed-authentication check ------------------------------------------------------------


def _flood(anon, address: str, times: int) -> None:
    for index in range(times):
        anon.credentials(HTTP_AUTHORIZATION=f"Bearer ctx_guess{index}_secret")
        assert anon.get("/api/v1/tenant", REMOTE_ADDR=address).status_code == 401


def cache_keys(address: str, *scopes: str) -> list[str]:
    """The current one-minute window keys of `address` in these scopes."""
    import time

    window = int(time.time() // 60)
    return [f"throttle:{scope}:{address}:{window}" for scope in scopes]


def _counters(address: str) -> dict[str, int]:
    """This address's counts in the current one-minute windows, read through the cache API."""
    from django.core.cache import cache

    scopes = ["address", "auth-failures"]
    found = cache.get_many(cache_keys(address, *scopes))
    return {key.split(":")[1]: int(value) for key, value in found.items() if value}


def test_a_cached_key_from_a_blocked_address_is_refused_and_not_counted(anon, api_a, rates, address):
    rates(auth_failure="2/min", key="100/min", address="100/min")
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 200  # the key is cached
    _flood(anon, address, 2)
    assert_throttled(api_a.get("/api/v1/tenant", REMOTE_ADDR=address))
    assert _counters(address) == {"auth-failures": 2}  # the refused request counted nowhere
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 200


def test_a_blocked_address_gets_429_before_any_key_lookup_and_is_not_charged_a_failure(
    anon, make_client, tenant_a, rates, address
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memory.models import ApiKey

    rates(auth_failure="2/min")
    _flood(anon, address, 2)
    fresh = make_client(tenant_a)  # a key this process has never looked up
    with CaptureQueriesContext(connection) as queries:
        assert_throttled(fresh.get("/api/v1/tenant", REMOTE_ADDR=address))
    assert not [q for q in queries.captured_queries if ApiKey._meta.db_table in q["sql"]]
    anon.credentials(HTTP_AUTHORIZATION="Bearer ctx_guess9_secret")  # a wrong key: 429, not 401
    assert_throttled(anon.get("/api/v1/tenant", REMOTE_ADDR=address))
    anon.credentials()  # no key at all: 429, not 401
    assert_throttled(anon.get("/api/v1/tenant", REMOTE_ADDR=address))
    assert _counters(address) == {"auth-failures": 2}


def test_a_blocked_address_gets_429_with_the_other_limits_off(anon, api_a, rates, address):
    rates(auth_failure="2/min", key=None, address=None)  # off
    assert api_a.get("/api/v1/tenant", REMOTE_ADDR=f"{address}1").status_code == 200
    _flood(anon, address, 2)
    assert_throttled(api_a.get("/api/v1/tenant", REMOTE_ADDR=address))
    anon.credentials(HTTP_AUTHORIZATION=f"Bearer {api_a.secret[:-4]}xxxx")  # cached prefix, wrong secret
    assert_throttled(anon.get("/api/v1/tenant", REMOTE_ADDR=address))
