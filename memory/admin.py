"""Django admin: tenants, API keys (secret shown once on creation), members, per-tenant policy.

Capabilities add their policy inline to POLICY_INLINES (one row per tenant each).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from memory.models import ApiKey, Membership, Tenant
from memory.services.tenancy import api_key_revoke

POLICY_INLINES: list[type[admin.options.InlineModelAdmin]] = []


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ["name", "prefix", "scopes", "created_at", "last_used_at", "expires_at", "revoked_at"]
    readonly_fields = fields
    show_change_link = True
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "is_active", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        return [MembershipInline, ApiKeyInline, *POLICY_INLINES]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "visible_prefix", "scopes", "last_used_at", "expires_at", "status"]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "tenant__slug"]
    readonly_fields = ["visible_prefix", "created_at", "last_used_at", "revoked_at"]
    fields = ["tenant", "name", "scopes", "expires_at", "visible_prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    @admin.display(description="key")
    def visible_prefix(self, obj: ApiKey) -> str:
        return f"ctx_{obj.prefix}_…" if obj.prefix else "(generated on save)"

    @admin.display(description="status")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked_at:
            return "revoked"
        if obj.expires_at and obj.expires_at <= timezone.now():
            return "expired"
        return "active"

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        full, prefix, digest = ApiKey.generate()
        obj.prefix, obj.secret_hash = prefix, digest
        super().save_model(request, obj, form, change)
        messages.warning(
            request,
            f"The new API key is {full} — copy it now: it is stored hashed and will not be shown again.",
        )

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for key in queryset:
            api_key_revoke(api_key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["tenant", "role"]
    autocomplete_fields = ["user", "tenant"]
