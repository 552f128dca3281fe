"""API rate limits, counted on the shared cache (Redis with REDIS_URL, else the database cache).

Counted through Django's cache API only (`add`, `incr`, `get`), never the backend's client or
the cache table, so the limits work on whichever cache backend is configured.

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
from abc import ABC, abstractmethod
from typing import Any

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.base import BaseCache
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
logger = logging.getLogger(__name__)


def client_address(request: HttpRequest | Request) -> str:
    """The client address: REMOTE_ADDR, or X-Forwarded-For's CTXAPP_NUM_PROXIES-th entry from the right."""
    meta = request.META
    proxies = settings.CTXAPP.num_proxies
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


def _cache() -> BaseCache:
    return caches["default"]


def window_count(key: str, duration: int) -> tuple[int, float]:
    """Count one hit of `key` in the current fixed window of `duration` seconds.

    Returns (hits in this window, seconds until it ends). See `window_counts`.
    """
    counts = window_counts([(key, duration)])
    assert counts is not None  # only `unless_over` answers None
    return counts[0]


def window_counts(
    keys: list[tuple[str, int]], *, unless_over: tuple[str, int] | None = None
) -> list[tuple[int, float]] | None:
    """Count one hit of each (key, window seconds) in its current fixed window.

    Returns (hits in this window, seconds until it ends) per key, in order. Through Django's
    cache API only (`incr`, and `add` to open a window), so any configured backend works and none is
    reached into: atomic on Redis; on the database cache `incr` is a read then a write, so
    concurrent requests may undercount a little, which a fallback rate limit can afford.

    `unless_over` = (counter key, limit): count nothing and return None when that counter (the
    failed authentications of this address) has reached the limit.
    """
    now = time.time()
    windows = [(_window_key(key, duration, now), int(now // duration), duration) for key, duration in keys]
    remaining = [(window + 1) * duration - now for _, window, duration in windows]
    cache = _cache()
    if unless_over is not None:
        guard_key, limit = unless_over
        if int(cache.get(guard_key) or 0) >= limit:
            return None
    counts = [
        _hit(cache, full_key, math.ceil(left) + 1)
        for (full_key, _, _), left in zip(windows, remaining, strict=True)
    ]
    return list(zip(counts, remaining, strict=True))


def _hit(cache: BaseCache, key: str, timeout: int) -> int:
    """One more hit of `key`; a new key starts at 1 with `timeout` seconds to live.

    `incr` first: every hit but a window's first then costs no `add`."""
    for _ in range(2):  # a key can appear (another request) or expire between the two calls
        try:
            return int(cache.incr(key))
        except ValueError:  # not there yet: this hit opens the window
            if cache.add(key, 1, timeout):
                return 1
    return 1


def _window_key(key: str, duration: int, now: float) -> str:
    return f"throttle:{key}:{int(now // duration)}"


def window_peek(key: str, duration: int) -> tuple[int, float]:
    """The hits of `key` in the current window, without counting one. Read-only."""
    now = time.time()
    full_key = _window_key(key, duration, now)
    remaining = (int(now // duration) + 1) * duration - now
    return int(_cache().get(full_key) or 0), remaining


class _SettingRateThrottle(BaseThrottle, ABC):
    scope = ""
    wait_seconds: float | None = None

    @abstractmethod
    def rate(self) -> str | None:
        """The rate this throttle applies (a `CTXAPP_THROTTLE_*` setting), or None when it is off."""

    @abstractmethod
    def ident(self, request: Request) -> str | None:
        """Who is counted (a key, an address), or None for a request this throttle leaves alone."""

    def window(self, request: Request) -> tuple[str, int, int] | None:
        """(counter key, limit, window seconds) of this request, or None when it is not counted."""
        parsed = parse_rate(self.rate())
        ident = self.ident(request)
        if parsed is None or ident is None:
            return None
        return f"{self.scope}:{ident}", parsed[0], parsed[1]

    def allow_request(self, request: Request, view: Any) -> bool:
        return not throttles_exceeded(request, view, [self])

    def wait(self) -> float | None:
        return self.wait_seconds


def throttles_exceeded(request: Request, view: Any, throttles: list[Any]) -> list[Any]:
    """Count this request against every throttle in one round trip; those whose rate it exceeds.

    Each exceeded throttle's `wait()` then answers the seconds until its window ends. Throttles
    not of this module are asked one by one (DRF's way).
    """
    exceeded = [
        t for t in throttles if not isinstance(t, _SettingRateThrottle) and not t.allow_request(request, view)
    ]
    counted = [
        (t, window)
        for t in throttles
        if isinstance(t, _SettingRateThrottle) and (window := t.window(request))
    ]
    # The failed-authentication check put off by `auth_failures_defer`: with the counts when some
    # limit counts this request, else on its own first.
    failures = _auth_failures_take(request) if counted else None
    if failures is None:
        auth_failures_settle(request)
    if not counted:
        return exceeded
    try:
        counts = window_counts(
            [(key, duration) for _, (key, _, duration) in counted],
            unless_over=failures[:2] if failures else None,
        )
    except Exception:  # the cache is down: fail open (see the module docstring)
        scopes = ", ".join(t.scope for t, _ in counted)
        logger.warning("API throttles %s not applied: the cache is unreachable", scopes, exc_info=True)
        return exceeded
    if counts is None:  # this address is over its failed-authentication rate: nothing counted
        raise _auth_failures_throttled(failures[2] if failures else 1.0)
    for (throttle, (_, limit, _)), (count, remaining) in zip(counted, counts, strict=True):
        if count > limit:
            throttle.wait_seconds = max(1.0, remaining)
            exceeded.append(throttle)
    return exceeded


class ApiKeyRateThrottle(_SettingRateThrottle):
    scope = "key"

    def rate(self) -> str | None:
        return settings.CTXAPP.throttle_key_rate

    def ident(self, request: Request) -> str | None:
        return getattr(request.auth, "prefix", None)  # None: not authenticated by a key


class ClientAddressRateThrottle(_SettingRateThrottle):
    scope = "address"

    def rate(self) -> str | None:
        return settings.CTXAPP.throttle_address_rate

    def ident(self, request: Request) -> str | None:
        return client_address(request)


def _auth_failure_key(request: Request) -> str:
    return f"auth-failures:{client_address(request)}"


def _auth_failures_throttled(remaining: float) -> exceptions.Throttled:
    return exceptions.Throttled(
        wait=max(1, math.ceil(remaining)),
        detail="Too many failed authentications from this address; wait before retrying.",
    )


def auth_failures_check(request: Request) -> None:
    """Raise Throttled (429) while this address is over its failed-authentication rate. Read-only."""
    parsed = parse_rate(settings.CTXAPP.throttle_auth_failure_rate)
    if parsed is None:
        return
    limit, duration = parsed
    try:
        failures, remaining = window_peek(_auth_failure_key(request), duration)
    except Exception:  # the cache is down: fail open (see the module docstring)
        logger.warning("Failed-authentication throttle not applied: the cache is unreachable")
        return
    if failures >= limit:
        raise _auth_failures_throttled(remaining)


# --- the failed-authentication check, put off until it costs no round trip of its own -----------
# An address over its failed-authentication rate gets 429 before its key is looked up, as before;
# but a key in the process cache (api_key_cache_seconds) is not looked up, so the check can wait
# for the rate-limit statement (`throttles_exceeded`), which then reads it and counts nothing when
# the address is over. Before a key lookup in the database, and before any error answer, it runs
# on its own (`auth_failures_settle`), so every answer is the same as with the check run first.
_PENDING = "_ctxapp_auth_failures_pending"


def _http_request(request: HttpRequest | Request) -> HttpRequest:
    return getattr(request, "_request", request)


def auth_failures_defer(request: Request) -> None:
    """Put off this request's failed-authentication check (see above)."""
    setattr(_http_request(request), _PENDING, True)


def auth_failures_settle(request: HttpRequest | Request) -> None:
    """Run the put-off check now (429 while the address is over its rate), if it has not run."""
    http = _http_request(request)
    if getattr(http, _PENDING, False):
        setattr(http, _PENDING, False)
        auth_failures_check(request)  # type: ignore[arg-type]


def _auth_failures_take(request: Request) -> tuple[str, int, float] | None:
    """The put-off check as (counter key, limit, seconds left) for the rate-limit statement."""
    http = _http_request(request)
    parsed = parse_rate(settings.CTXAPP.throttle_auth_failure_rate)
    if not getattr(http, _PENDING, False) or parsed is None:
        return None
    setattr(http, _PENDING, False)
    limit, duration = parsed
    now = time.time()
    remaining = (int(now // duration) + 1) * duration - now
    return _window_key(_auth_failure_key(request), duration, now), limit, remaining


def auth_failure_record(request: Request) -> None:
    """Count one failed authentication of this address, in the rate's current window."""
    parsed = parse_rate(settings.CTXAPP.throttle_auth_failure_rate)
    if parsed is None:
        return
    try:
        window_count(_auth_failure_key(request), parsed[1])
    except Exception:  # the cache is down: fail open (see the module docstring)
        logger.warning("Failed authentication not counted: the cache is unreachable")
