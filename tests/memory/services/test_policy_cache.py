"""Per-tenant configuration read once (memory/models/policy_cache.py), in one process: a warm context
build reads no policy row; a change is seen at once; a change rolled back is never served; without
Redis every read goes to the database. Two processes: test_policy_cache_processes.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from memory.models import ContextPolicy, SharingPolicy, Tenant, TenantPolicyBase, policy_cache

pytestmark = pytest.mark.django_db

POLICY_TABLES = [m._meta.db_table for m in apps.get_models() if issubclass(m, TenantPolicyBase)]


def _policy_reads(run: Any) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        run()
    return [q["sql"][:120] for q in queries.captured_queries if any(t in q["sql"] for t in POLICY_TABLES)]


def test_a_warm_context_build_reads_no_policy_row(api_a: Any) -> None:
    session = api_a.post("/api/v1/sessions", {"agent": "bot", "user_id": "u1"}, format="json").json()["id"]
    api_a.post(f"/api/v1/sessions/{session}/messages", {"role": "user", "content": "hi"}, format="json")

    def build() -> None:
        response = api_a.post(
            f"/api/v1/sessions/{session}/context", {"input": "what did I say?"}, format="json"
        )
        assert response.status_code == 200, response.content

    assert _policy_reads(build)  # the first reads (and creates) the tenant's rows
    assert _policy_reads(build) == []


def test_a_saved_change_is_seen_at_once(tenant_a: Tenant) -> None:
    assert SharingPolicy.for_tenant(tenant_a).share_messages is False
    assert _policy_reads(lambda: SharingPolicy.for_tenant(tenant_a)) == []  # from memory
    policy = SharingPolicy.objects.get(tenant=tenant_a)
    policy.share_messages = True
    policy.save()
    assert SharingPolicy.for_tenant(tenant_a).share_messages is True


def test_a_change_rolled_back_is_never_served(tenant_a: Tenant) -> None:
    assert ContextPolicy.for_tenant(tenant_a).history_window != 3
    with transaction.atomic():
        policy = ContextPolicy.objects.get(tenant=tenant_a)
        policy.history_window = 3
        policy.save()
        assert ContextPolicy.for_tenant(tenant_a).history_window == 3  # its own change
        transaction.set_rollback(True)
    assert ContextPolicy.for_tenant(tenant_a).history_window != 3
    policy_cache.unit_begin()  # the next request
    assert ContextPolicy.for_tenant(tenant_a).history_window != 3


def test_without_redis_every_read_goes_to_the_database(settings: Any, tenant_a: Tenant) -> None:
    SharingPolicy.for_tenant(tenant_a)
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.2, "SOCKET_TIMEOUT": 0.2},
        }
    }
    policy_cache.unit_begin()
    SharingPolicy.objects.filter(tenant=tenant_a).update(share_digests=True)  # no new version
    assert SharingPolicy.for_tenant(tenant_a).share_digests is True
