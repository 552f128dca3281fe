"""API rate limits, counted on the shared cache (Redis with REDIS_URL, else the database cache).

Three limits, each a setting (`CTXAPP_THROTTLE_*`), each answering 429 `rate_limited` with a
`Retry-After` header:
- per API key (`ApiKeyRateThrottle`), so one agent cannot starve the others;
- per client address (`ClientAddressRateThrottle`), over all the keys it uses;
- failed authentications per client address (`auth_failures_*`): a flood of invalid keys turns
  into 429s before any key lookup, so guessing keys costs the guesser, not the database.

The client address is the socket's, or the right `CTXAPP_NUM_PROXIES`-th X-Forwarded-For entry
(`client_address`), so a client cannot pick its own address by sending the header.

The limits fail open: while the cache is unreachable (Redis down) requests are not counted and
not refused, because an outage of the limiter must not turn every write into a 500.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
logger = logging.getLogger(__name__)


def client_address(request: HttpRequest | Request) -> str:
    """The client address: REMOTE_ADDR, or X-Forwarded-For's CTXAPP_NUM_PROXIES-th entry from the right."""
    meta = request.META
    proxies = settings.CTXAPP["CTXAPP_NUM_PROXIES"]
    forwarded = [part.strip() for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    if proxies > 0 and forwarded:
        return forwarded[-min(proxies, len(forwarded))]
    return str(meta.get("REMOTE_ADDR") or "unknown")


def login_client_address(request: HttpRequest) -> str | None:
    """The client address for django-axes: None when unknown (a request built without one)."""
    address = client_address(request)
    return None if address == "unknown" else address


def parse_rate(rate: str | None) -> tuple[int, int] | None:
    """`600/min` → (600, 60); None (off) → None."""
    if not rate:
        return None
    count, _, unit = rate.partition("/")
    return int(count), DURATIONS[unit[0]]


def window_count(key: str, duration: int) -> tuple[int, float]:
    """Count one hit of `key` in the current fixed window of `duration` seconds.

    Returns (hits in this window, seconds until it ends). O(1) on the cache: an add and an incr,
    instead of the timestamp list DRF's SimpleRateThrottle rewrites on every request.
    """
    now = time.time()
    window = int(now // duration)
    full_key = f"throttle:{key}:{window}"
    cache.add(full_key, 0, timeout=duration + 1)
    try:
        count = cache.incr(full_key)
    except ValueError:  # expired between add and incr
        cache.add(full_key, 1, timeout=duration + 1)
        count = 1
    return count, (window + 1) * duration - now


class _SettingRateThrottle(BaseThrottle):
    scope = ""
    setting = ""
    wait_seconds: float | None = None

    def ident(self, request: Request) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Request, view: Any) -> bool:
        parsed = parse_rate(settings.CTXAPP[self.setting])
        ident = self.ident(request)
        if parsed is None or ident is None:
            return True
        limit, duration = parsed
        try:
            count, remaining = window_count(f"{self.scope}:{ident}", duration)
        except Exception:  # the cache is down: fail open (see the module docstring)
            logger.warning("API throttle %s not applied: the cache is unreachable", self.scope, exc_info=True)
            return True
        if count <= limit:
            return True
        self.wait_seconds = max(1.0, remaining)
        return False

    def wait(self) -> float | None:
        return self.wait_seconds


class ApiKeyRateThrottle(_SettingRateThrottle):
    scope = "key"
    setting = "CTXAPP_THROTTLE_KEY_RATE"

    def ident(self, request: Request) -> str | None:
        return getattr(request.auth, "prefix", None)  # None: not authenticated by a key


class ClientAddressRateThrottle(_SettingRateThrottle):
    scope = "address"
    setting = "CTXAPP_THROTTLE_ADDRESS_RATE"

    def ident(self, request: Request) -> str | None:
        return client_address(request)


def _auth_failure_key(request: Request) -> str:
    return f"auth-failures:{client_address(request)}"


def auth_failures_check(request: Request) -> None:
    """Raise Throttled (429) while this address is over its failed-authentication rate. Read-only."""
    parsed = parse_rate(settings.CTXAPP["CTXAPP_THROTTLE_AUTH_FAILURE_RATE"])
    if parsed is None:
        return
    limit, duration = parsed
    now = time.time()
    window = int(now // duration)
    try:
        failures = cache.get(f"throttle:{_auth_failure_key(request)}:{window}") or 0
    except Exception:  # the cache is down: fail open (see the module docstring)
        logger.warning("Failed-authentication throttle not applied: the cache is unreachable")
        return
    if failures >= limit:
        raise exceptions.Throttled(
            wait=math.ceil((window + 1) * duration - now),
            detail="Too many failed authentications from this address; wait before retrying.",
        )


def auth_failure_record(request: Request) -> None:
    """Count one failed authentication of this address, in the rate's current window."""
    parsed = parse_rate(settings.CTXAPP["CTXAPP_THROTTLE_AUTH_FAILURE_RATE"])
    if parsed is None:
        return
    try:
        window_count(_auth_failure_key(request), parsed[1])
    except Exception:  # the cache is down: fail open (see the module docstring)
        logger.warning("Failed authentication not counted: the cache is unreachable")
