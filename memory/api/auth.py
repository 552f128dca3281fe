"""Bearer API-key authentication and scope checks for /api/v1."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from memory.api import throttles
from memory.models import KEY_PREFIX, ApiKey, ApiKeyScope, hash_secret
from memory.services.tenancy import api_keys_generation


class ApiPrincipal:
    """What request.user is for an API call: the key's tenant, never a dashboard user."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.tenant = api_key.tenant

    def __str__(self) -> str:
        return f"api-key {KEY_PREFIX}{self.api_key.prefix}"


# prefix -> (monotonic time read, generation read under, the key with its tenant)
_cache: dict[str, tuple[float, str, ApiKey]] = {}
_cache_lock = threading.Lock()


def _api_key_lookup(prefix: str, before_lookup: Callable[[], None] | None = None) -> ApiKey | None:
    """The key with this prefix (and its tenant), from the process cache while it is fresh.

    Fresh = read less than CTXAPP_API_KEY_CACHE_SECONDS ago, under the current generation
    (memory.services.tenancy.api_keys_changed starts a new one on every revocation). Only keys
    that exist are cached; the checks (hash, revoked, expired, tenant) run on every request.
    `before_lookup` runs before the database is asked (the failed-authentication check).
    """
    ttl = settings.CTXAPP.api_key_cache_seconds
    if ttl <= 0:
        if before_lookup is not None:
            before_lookup()
        return ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
    generation = api_keys_generation()
    now = time.monotonic()
    cached = _cache.get(prefix)
    if cached is not None and cached[1] == generation and now - cached[0] < ttl:
        return cached[2]
    if before_lookup is not None:
        before_lookup()
    api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
    if api_key is not None:
        with _cache_lock:
            if len(_cache) > 10_000:  # a bound, not a policy: keys are few
                _cache.clear()
            _cache[prefix] = (now, generation, api_key)
    return api_key


def api_key_authenticate(raw: str, before_lookup: Callable[[], None] | None = None) -> ApiKey:
    """Return the usable ApiKey for `raw` or raise AuthenticationFailed. Touches last_used_at.

    The lookup may come from the process cache (see _api_key_lookup); revocation is honoured at once.
    `before_lookup` runs before a lookup in the database (not for a cached key).
    """
    parts = raw.split("_")
    if not raw.startswith(KEY_PREFIX) or len(parts) < 3:
        raise exceptions.AuthenticationFailed("The API key is not valid.")
    prefix = parts[1]
    api_key = _api_key_lookup(prefix, before_lookup)
    if api_key is None or not hmac.compare_digest(api_key.secret_hash, hash_secret(raw)):
        raise exceptions.AuthenticationFailed("The API key is not valid.")
    if api_key.revoked_at is not None:
        raise exceptions.AuthenticationFailed("The API key was revoked; ask an admin for a new one.")
    now = timezone.now()
    if api_key.expires_at is not None and api_key.expires_at <= now:
        raise exceptions.AuthenticationFailed("The API key has expired; ask an admin for a new one.")
    if not api_key.tenant.is_active:
        raise exceptions.AuthenticationFailed("The tenant of this API key is disabled.")
    touch_every = timedelta(seconds=settings.CTXAPP.api_key_touch_seconds)
    if api_key.last_used_at is None or now - api_key.last_used_at > touch_every:
        # A conditional update: concurrent requests touch the row once, not once each.
        ApiKey.objects.filter(pk=api_key.pk).exclude(last_used_at__gt=now - touch_every).update(
            last_used_at=now
        )
        api_key.last_used_at = now
    return api_key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Authorization: Bearer <api key>'."
            )
        # An address over its failed-authentication rate gets 429 before any lookup in the database.
        api_key = api_key_authenticate(raw.strip(), lambda: throttles.auth_failures_settle(request))
        return ApiPrincipal(api_key), api_key

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class HasScope(permissions.BasePermission):
    """Reads need `read`, writes need `write`; a view may demand `admin` via `required_scope`."""

    message = "This API key lacks the scope this request needs."

    def has_permission(self, request: Request, view: Any) -> bool:
        if not isinstance(request.auth, ApiKey):
            raise exceptions.NotAuthenticated()
        required = getattr(view, "required_scope", None) or (
            ApiKeyScope.READ if request.method in READ_METHODS else ApiKeyScope.WRITE
        )
        scopes = request.auth.effective_scopes
        if ApiKeyScope.ADMIN in scopes:
            return True
        if required not in scopes:
            self.message = f"This API key lacks the '{required}' scope this request needs."
            if required == ApiKeyScope.ADMIN:
                self.message += (
                    " Forgetting a user, managing API keys and tenant policies need an admin key: create "
                    f"one with `ctxapp manage create_api_key --tenant {request.auth.tenant.slug} --scopes "
                    "admin` (its secret is printed once), or in the admin's API keys page (/admin/)."
                )
            return False
        return True
