"""Per-tenant configuration read once: the policy rows (`TenantPolicyBase.for_tenant`) from a
per-process cache, checked against a version in Redis.

Every policy row (budget, memory, sharing, retention, decay, checkpoint, experiences) is read from
the database once per process, then served from memory while the tenant's version in the shared
cache (Redis) is the one it was read under. A change makes a new version: a save or delete of any
policy row (the admin, the API, any ORM `save()`) writes a new random token for its tenant at once
(inside the writer's transaction) and again when that transaction commits, and `migrate` writes a
new token for every tenant at once (`post_migrate`). A process that reads a token it did not cache
under reads the rows again, so every process sees a change at the first request that starts after
it; the token written at commit drops what a process read in between (the old, committed row).
A random token, not a counter: a Redis that lost its data (no persistence) cannot hand back a
version some process cached an older row under.

What a check costs: one `MGET` of two keys (this tenant's token, the epoch `migrate` renews) on
the cache's pooled connection (django-redis), at most once per request or job and tenant: the
tokens read are kept for the unit of work (`unit_begin`: Django's request_started, Celery's
task_prerun) and at most MEMO_SECONDS outside one (a shell, a management command). A unit of work
sees one version of the configuration, as of its first read. Measured with bench/bench_cost.py
(docs/benchmarks.md): a context build read 10 policy rows (10 statements) before.

Raw SQL that changes a policy row outside Django (psql, a RunSQL migration is followed by
post_migrate) is seen at the next change of that tenant's policies, or after a restart. Redis
unreachable: every read goes to the database, as without the cache.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from contextvars import ContextVar
from typing import Any, TypeVar

from django.core.cache import cache
from django.db import models, transaction

logger = logging.getLogger(__name__)

EPOCH_KEY = "tenant-config:epoch"
MEMO_SECONDS = 1.0

P = TypeVar("P", bound=models.Model)
Version = tuple[Any, Any]

# (policy model, tenant id) -> (version it was read under, the row)
_entries: dict[tuple[type[models.Model], int], tuple[Version, models.Model]] = {}
_lock = threading.Lock()
# tenant id -> (monotonic time read, version): the versions this unit of work has read.
_seen: ContextVar[dict[int, tuple[float, Version]] | None] = ContextVar("tenant_config_seen", default=None)
# Set while policy_get creates a missing row with the defaults.
_creating: ContextVar[bool] = ContextVar("tenant_config_creating", default=False)
# Tenants (None: all) whose policies this unit of work changed in a transaction not committed yet:
# what it reads of them is its own uncommitted change, never cached (it may be rolled back).
_pending: ContextVar[frozenset[int | None]] = ContextVar("tenant_config_pending", default=frozenset())


def _tenant_key(tenant_id: int) -> str:
    return f"tenant-config:{tenant_id}"


def unit_begin(**_: Any) -> None:
    """A request or a job starts: it reads the versions afresh (signal receiver)."""
    _seen.set(None)
    _pending.set(frozenset())


def version_of(tenant_id: int) -> Version | None:
    """The tenant's configuration version now (memoised for the unit of work); None when the
    cache cannot be asked (then nothing is served from memory)."""
    now = time.monotonic()
    seen = _seen.get()
    if seen is not None:
        hit = seen.get(tenant_id)
        if hit is not None and now - hit[0] < MEMO_SECONDS:
            return hit[1]
    key = _tenant_key(tenant_id)
    try:
        values = cache.get_many([EPOCH_KEY, key])
    except Exception:  # the cache is down: read the rows, as without this cache
        logger.debug("tenant configuration version unavailable", exc_info=True)
        return None
    version = (values.get(EPOCH_KEY), values.get(key))
    _seen.set({**(seen or {}), tenant_id: (now, version)})
    return version


def policy_get(model: type[P], tenant: Any) -> P:
    """The tenant's row of policy `model` (created with its defaults on first use), from this
    process's memory while the tenant's version is unchanged. Shared by the process: change a
    policy through its service (e.g. memory.services.tenancy.tenant_policy_update) or `save()`,
    never by setting attributes alone."""
    version = version_of(tenant.pk)
    if version is not None:
        entry = _entries.get((model, tenant.pk))
        if entry is not None and entry[0] == version:
            return entry[1]  # type: ignore[return-value]
    # A row created here holds the defaults every process would create: not a change (no new
    # version), so the first use of a policy does not drop the tenant's other rows everywhere.
    creating = _creating.set(True)
    try:
        policy, _ = model._default_manager.get_or_create(tenant=tenant)
    finally:
        _creating.reset(creating)
    pending = _pending.get()
    if version is not None and tenant.pk not in pending and None not in pending:
        # Not the tenant object it was read with: a cached row must not keep a stale tenant alive.
        policy._state.fields_cache.pop("tenant", None)
        with _lock:
            _entries[(model, tenant.pk)] = (version, policy)
    return policy


def _bump(tenant_id: int | None) -> None:
    key = EPOCH_KEY if tenant_id is None else _tenant_key(tenant_id)
    try:
        cache.set(key, uuid.uuid4().hex, timeout=None)
    except Exception as exc:  # e.g. `ctxapp up` migrates before it starts its Redis: nobody to tell yet
        logger.warning("could not publish a tenant configuration change (%s): %s", key, exc)


def _forget(tenant_id: int | None) -> None:
    with _lock:
        for entry in [k for k in _entries if tenant_id is None or k[1] == tenant_id]:
            del _entries[entry]
    _seen.set(None)


def policy_changed(*, tenant_id: int | None) -> None:
    """A policy row of `tenant_id` (None: of any tenant) changed: a new version now, and another
    when the current transaction commits (see the module docstring)."""
    _forget(tenant_id)
    _bump(tenant_id)
    if transaction.get_connection().in_atomic_block:
        _pending.set(_pending.get() | {tenant_id})

        def after_commit() -> None:
            _pending.set(_pending.get() - {tenant_id})
            _forget(tenant_id)
            _bump(tenant_id)

        transaction.on_commit(after_commit)


def policy_saved(sender: type[models.Model], instance: Any, **_: Any) -> None:
    """post_save / post_delete receiver of every policy model."""
    if not _creating.get():
        policy_changed(tenant_id=instance.tenant_id)


def policies_migrated(**_: Any) -> None:
    """post_migrate receiver: a migration may have changed any tenant's rows."""
    policy_changed(tenant_id=None)
