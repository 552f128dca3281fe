"""API conventions: bearer keys, the tenant's own keys, the JSON error shape, limits, schema, health.

Alice (tenant_a) and Bob (tenant_b) must never see or touch each other's keys.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from memory.models import ApiKey, Event
from memory.services.tenancy import api_key_create, api_key_revoke

pytestmark = pytest.mark.django_db


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    return body


@pytest.fixture
def admin_a(make_client: Any, tenant_a: Any) -> Any:
    """Alice's admin-scope client: may manage her tenant's keys."""
    return make_client(tenant_a, ["admin"])


@pytest.fixture
def admin_b(make_client: Any, tenant_b: Any) -> Any:
    return make_client(tenant_b, ["admin"])


def key_count() -> int:
    return ApiKey.objects.count()


# --- who am I ---------------------------------------------------------------------------------


def test_it_reads_the_tenant_of_the_key(api_a: Any, tenant_a: Any) -> None:
    response = api_a.get("/api/v1/tenant")
    assert response.status_code == 200
    assert response.json() == {
        "slug": tenant_a.slug,
        "name": tenant_a.name,
        "key_prefix": api_a.api_key.prefix,
        "scopes": ["read", "write"],
    }


def test_each_key_sees_its_own_tenant(api_a: Any, api_b: Any) -> None:
    assert api_a.get("/api/v1/tenant").json()["slug"] == "alice"
    assert api_b.get("/api/v1/tenant").json()["slug"] == "bob"


# --- 401 ----------------------------------------------------------------------------------------


def test_no_key_is_401(anon: Any) -> None:
    response = anon.get("/api/v1/tenant")
    body = assert_error(response, 401, "unauthenticated")
    assert "Bearer" in body["error"]["message"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_wrong_key_is_401(anon: Any, api_a: Any) -> None:
    # The right prefix with a wrong secret, and a key that does not exist at all.
    for raw in (f"ctx_{api_a.api_key.prefix}_notthesecret", "ctx_deadbeef_notthesecret", "garbage"):
        anon.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        response = assert_error(anon.get("/api/v1/tenant"), 401, "invalid_api_key")
        assert response["error"]["message"] == "The API key is not valid."


def test_malformed_header_is_401(anon: Any) -> None:
    for header in ("Token abc", "Bearer", "Bearer   "):
        anon.credentials(HTTP_AUTHORIZATION=header)
        assert_error(anon.get("/api/v1/tenant"), 401, "invalid_api_key")


def test_revoked_key_is_401(api_a: Any) -> None:
    api_key_revoke(api_key=api_a.api_key)
    body = assert_error(api_a.get("/api/v1/tenant"), 401, "invalid_api_key")
    assert "revoked" in body["error"]["message"]


def test_expired_key_is_401(tenant_a: Any, anon: Any) -> None:
    _, secret = api_key_create(tenant=tenant_a, name="old", expires_at=timezone.now() - timedelta(seconds=1))
    anon.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = assert_error(anon.get("/api/v1/tenant"), 401, "invalid_api_key")
    assert "expired" in body["error"]["message"]


def test_disabled_tenant_is_401(api_a: Any, tenant_a: Any) -> None:
    tenant_a.is_active = False
    tenant_a.save(update_fields=["is_active"])
    body = assert_error(api_a.get("/api/v1/tenant"), 401, "invalid_api_key")
    assert "disabled" in body["error"]["message"]


def test_a_rejected_key_writes_nothing(anon: Any, api_a: Any) -> None:
    api_key_revoke(api_key=api_a.api_key)
    before = (key_count(), Event.objects.count())
    response = api_a.post("/api/v1/tenant/api-keys", {"name": "sneaky"}, format="json")
    assert_error(response, 401, "invalid_api_key")
    assert (key_count(), Event.objects.count()) == before
    assert ApiKey.objects.get(pk=api_a.api_key.pk).last_used_at is None


def test_key_is_stored_hashed_and_touched(api_a: Any) -> None:
    key = ApiKey.objects.get(pk=api_a.api_key.pk)
    assert api_a.secret not in (key.secret_hash, key.prefix)
    assert api_a.secret.startswith(f"ctx_{key.prefix}_")
    assert key.last_used_at is None
    api_a.get("/api/v1/tenant")
    key.refresh_from_db()
    assert key.last_used_at is not None


# --- 403 ----------------------------------------------------------------------------------------


def test_read_only_key_cannot_write(make_client: Any, tenant_a: Any) -> None:
    client = make_client(tenant_a, ["read"])
    assert client.get("/api/v1/tenant").status_code == 200
    before = key_count()
    response = client.post("/api/v1/tenant/api-keys", {"name": "x"}, format="json")
    body = assert_error(response, 403, "forbidden")
    assert "'admin'" in body["error"]["message"]
    assert key_count() == before


def test_read_write_key_cannot_manage_keys(api_a: Any) -> None:
    before = key_count()
    assert_error(api_a.post("/api/v1/tenant/api-keys", {"name": "x"}, format="json"), 403, "forbidden")
    assert_error(api_a.get("/api/v1/tenant/api-keys"), 403, "forbidden")
    assert_error(api_a.delete(f"/api/v1/tenant/api-keys/{api_a.api_key.prefix}"), 403, "forbidden")
    assert key_count() == before
    assert ApiKey.objects.get(pk=api_a.api_key.pk).revoked_at is None


# --- the tenant's API keys ------------------------------------------------------------------------


def test_admin_creates_a_key_and_sees_the_secret_once(admin_a: Any, tenant_a: Any, anon: Any) -> None:
    expires = timezone.now() + timedelta(days=30)
    response = admin_a.post(
        "/api/v1/tenant/api-keys",
        {"name": "ci bot", "scopes": ["read"], "expires_at": expires.isoformat()},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["name"] == "ci bot"
    assert body["scopes"] == ["read"]
    assert body["status"] == "active"
    assert body["key"].startswith(f"ctx_{body['prefix']}_")
    stored = ApiKey.objects.get(prefix=body["prefix"])
    assert stored.tenant == tenant_a
    assert stored.secret_hash != body["key"] and body["key"] not in stored.secret_hash
    assert stored.expires_at == expires
    # The new key works, with exactly its scopes.
    anon.credentials(HTTP_AUTHORIZATION=f"Bearer {body['key']}")
    assert anon.get("/api/v1/tenant").json()["scopes"] == ["read"]
    # The secret is never shown again: not in the list, not in the detail.
    listed = admin_a.get("/api/v1/tenant/api-keys").json()["items"]
    assert body["prefix"] in [item["prefix"] for item in listed]
    assert all("key" not in item for item in listed)
    assert "key" not in admin_a.get(f"/api/v1/tenant/api-keys/{body['prefix']}").json()
    # The audit trail names the key and who created it.
    event = Event.objects.get(tenant=tenant_a, type="api_key.created")
    assert event.payload["key_prefix"] == body["prefix"]
    assert event.payload["actor"] == f"api-key ctx_{admin_a.api_key.prefix}"


def test_admin_revokes_a_key(admin_a: Any, api_a: Any, tenant_a: Any) -> None:
    prefix = api_a.api_key.prefix
    response = admin_a.delete(f"/api/v1/tenant/api-keys/{prefix}")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "revoked"
    assert ApiKey.objects.get(prefix=prefix).revoked_at is not None
    assert_error(api_a.get("/api/v1/tenant"), 401, "invalid_api_key")
    # Idempotent: a second revocation changes nothing and records nothing more.
    revoked_at = ApiKey.objects.get(prefix=prefix).revoked_at
    assert admin_a.delete(f"/api/v1/tenant/api-keys/{prefix}").status_code == 200
    assert ApiKey.objects.get(prefix=prefix).revoked_at == revoked_at
    assert Event.objects.filter(tenant=tenant_a, type="api_key.revoked").count() == 1


def test_admin_lists_keys_with_their_status(admin_a: Any, tenant_a: Any, api_a: Any) -> None:
    expired, _ = api_key_create(tenant=tenant_a, name="old", expires_at=timezone.now() - timedelta(days=1))
    revoked, _ = api_key_create(tenant=tenant_a, name="gone")
    api_key_revoke(api_key=revoked)
    response = admin_a.get("/api/v1/tenant/api-keys?limit=2")
    assert response.status_code == 200
    first = response.json()
    assert len(first["items"]) == 2 and first["next_cursor"] and first["next"] == first["next_cursor"]
    rest = admin_a.get(f"/api/v1/tenant/api-keys?cursor={first['next_cursor']}").json()
    statuses = {item["prefix"]: item["status"] for item in first["items"] + rest["items"]}
    assert statuses == {
        admin_a.api_key.prefix: "active",
        api_a.api_key.prefix: "active",
        expired.prefix: "expired",
        revoked.prefix: "revoked",
    }


def test_bob_cannot_see_or_revoke_alices_keys(admin_a: Any, admin_b: Any, api_a: Any) -> None:
    prefix = api_a.api_key.prefix
    listed = admin_b.get("/api/v1/tenant/api-keys").json()["items"]
    assert [item["prefix"] for item in listed] == [admin_b.api_key.prefix]
    missing = assert_error(admin_b.get("/api/v1/tenant/api-keys/nosuchkey"), 404, "not_found")
    foreign = assert_error(admin_b.get(f"/api/v1/tenant/api-keys/{prefix}"), 404, "not_found")
    assert foreign["error"]["message"] == missing["error"]["message"].replace("nosuchkey", prefix)
    assert_error(admin_b.delete(f"/api/v1/tenant/api-keys/{prefix}"), 404, "not_found")
    assert ApiKey.objects.get(prefix=prefix).revoked_at is None
    assert api_a.get("/api/v1/tenant").status_code == 200
    assert not Event.objects.filter(type="api_key.revoked").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"name": "k", "scopes": ["superuser"]}, "scopes"),
        ({"name": "k", "scopes": "read"}, "scopes"),
        ({"name": "k", "expires_at": "yesterday"}, "expires_at"),
        ({"name": "k", "expires_at": "2000-01-01T00:00:00Z"}, "expires_at"),
    ],
)
def test_invalid_key_requests_are_422_naming_the_field(
    admin_a: Any, body: dict[str, Any], field: str
) -> None:
    before = (key_count(), Event.objects.count())
    response = admin_a.post("/api/v1/tenant/api-keys", body, format="json")
    error = assert_error(response, 422, "validation_error")
    assert field in error["error"]["details"]["fields"]
    assert error["error"]["message"].startswith(field)
    assert (key_count(), Event.objects.count()) == before


def test_creating_a_key_is_idempotent_with_a_key_header(admin_a: Any) -> None:
    before = key_count()
    first = admin_a.post(
        "/api/v1/tenant/api-keys", {"name": "once"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    again = admin_a.post(
        "/api/v1/tenant/api-keys", {"name": "once"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["prefix"] == first.json()["prefix"]
    assert key_count() == before + 1
    other = admin_a.post(
        "/api/v1/tenant/api-keys", {"name": "twice"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
    )
    assert_error(other, 409, "idempotency_conflict")
    assert key_count() == before + 1


# --- malformed requests: 400, 413, 415, 405, 404 -------------------------------------------------


def test_malformed_json_is_400_and_writes_nothing(admin_a: Any) -> None:
    before = (key_count(), Event.objects.count())
    for raw in ('{"name": "x",', "{not json", '{"name": "\\ud800"'):
        response = admin_a.generic("POST", "/api/v1/tenant/api-keys", raw, content_type="application/json")
        assert_error(response, 400, "invalid_json")
    assert (key_count(), Event.objects.count()) == before


def test_a_json_body_that_is_not_an_object_is_422(admin_a: Any) -> None:
    before = key_count()
    response = admin_a.generic("POST", "/api/v1/tenant/api-keys", "[1, 2]", content_type="application/json")
    assert_error(response, 422, "validation_error")
    assert key_count() == before


def test_body_over_the_limit_is_413_and_writes_nothing(admin_a: Any) -> None:
    before = (key_count(), Event.objects.count())
    body = json.dumps({"name": "x" * 500})
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100):
        response = admin_a.generic("POST", "/api/v1/tenant/api-keys", body, content_type="application/json")
        error = assert_error(response, 413, "payload_too_large")
        assert error["error"]["details"] == {"limit_bytes": 100}
        # A small body still passes under the same limit.
        ok = admin_a.post("/api/v1/tenant/api-keys", {"name": "small"}, format="json")
        assert ok.status_code == 201
    assert (key_count(), Event.objects.count()) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_wrong_content_type_is_415_and_writes_nothing(admin_a: Any, content_type: str) -> None:
    before = key_count()
    response = admin_a.generic("POST", "/api/v1/tenant/api-keys", '{"name": "x"}', content_type=content_type)
    body = assert_error(response, 415, "unsupported_media_type")
    assert "application/json" in body["error"]["message"]
    assert key_count() == before


def test_wrong_method_is_405(api_a: Any, admin_a: Any) -> None:
    response = api_a.delete("/api/v1/tenant")
    body = assert_error(response, 405, "method_not_allowed")
    assert "DELETE" in body["error"]["message"]
    assert_error(admin_a.put("/api/v1/tenant/api-keys", {}, format="json"), 405, "method_not_allowed")


def test_unknown_api_path_is_json_404(api_a: Any, anon: Any) -> None:
    body = assert_error(api_a.get("/api/v1/no-such-thing"), 404, "not_found")
    assert "/api/v1/no-such-thing" in body["error"]["message"]
    assert_error(anon.get("/api/v2/tenant"), 404, "not_found")
    assert_error(anon.post("/api/nothing-here", {}, format="json"), 404, "not_found")


def test_unknown_page_outside_the_api_is_html_404(anon: Any) -> None:
    response = anon.get("/no-such-page")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")


# --- schema and health ------------------------------------------------------------------------------


def test_schema_and_docs_are_served(anon: Any) -> None:
    schema = anon.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    paths = json.loads(schema.content)["paths"]
    assert {"/api/v1/tenant", "/api/v1/tenant/api-keys", "/api/v1/tenant/api-keys/{prefix}"} <= set(paths)
    assert "201" in paths["/api/v1/tenant/api-keys"]["post"]["responses"]
    assert anon.get("/api/docs/").status_code == 200


def test_healthz(anon: Any) -> None:
    assert anon.get("/healthz").json() == {"status": "ok"}


def test_readyz_reports_each_dependency(anon: Any) -> None:
    from django.core.cache import cache

    from memory.services.job_health import HEARTBEAT_KEY

    cache.delete(HEARTBEAT_KEY)  # a worker of an earlier test stamped it in the shared cache
    for _ in range(2):  # the second probe reuses the probe channel
        response = anon.get("/readyz")
        body = response.json()
        assert response.status_code == 200, body
        assert body["status"] == "ok"
        assert set(body["checks"]) == {"database", "broker", "channel_layer", "jobs"}
        assert all(check["ok"] for check in body["checks"].values())
        assert body["checks"]["database"]["pgvector"]
        assert body["checks"]["broker"]["transport"] == "redis"
        assert body["checks"]["channel_layer"]["backend"] == "RedisChannelLayer"
        # No worker ran here: no heartbeat, nothing queued, nothing finished, and not stalled.
        assert body["checks"]["jobs"] == {
            "ok": True,
            "oldest_queued_age_s": None,
            "last_finished_at": None,
            "heartbeat_age_s": None,
            "deadline_s": 60.0,
            "stalled": False,
            "ms": body["checks"]["jobs"]["ms"],
        }


def test_readyz_reports_a_broker_outage_as_degraded(anon: Any, monkeypatch: Any) -> None:
    from ctxapp.celery import app

    # A real broker that is not there: nothing listens on port 1. Writes still work (their jobs
    # wait in the outbox), so the web process is degraded, not down.
    monkeypatch.setattr(app.conf, "broker_write_url", "redis://127.0.0.1:1/0")
    response = anon.get("/readyz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["broker"]["ok"] is False and body["checks"]["broker"]["degraded"] is True
    assert body["checks"]["broker"]["jobs_waiting"] == 0
    assert "refused" in body["checks"]["broker"]["error"].lower()
    assert body["checks"]["database"]["ok"] and body["checks"]["channel_layer"]["ok"]
