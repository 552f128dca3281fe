"""Django admin: tenants, API keys (secret shown once on creation), members, per-tenant policy.

Capabilities add their policy inline to POLICY_INLINES (one row per tenant each).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from memory.models import ApiKey, ApiKeyScope, Membership, Tenant
from memory.services.tenancy import api_key_create, api_key_revoke

POLICY_INLINES: list[type[admin.options.InlineModelAdmin]] = []


def scopes_text(key: ApiKey) -> str:
    """A key's scopes in words: no scopes ticked means read and write."""
    return ", ".join(key.scopes) if key.scopes else "read, write (default)"


class SavedOnlyFieldsMixin:
    """Fields that only a saved row has (its creation time, its use): left off the add form, where
    they would show an empty value or a time before anything was saved."""

    saved_only_fields: tuple[str, ...] = ("created_at", "updated_at", "last_used_at", "revoked_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        fields = list(super().get_fields(request, obj))  # type: ignore[misc]
        return fields if obj is not None else [f for f in fields if f not in self.saved_only_fields]


class RecordAdmin(SavedOnlyFieldsMixin, admin.ModelAdmin):
    """Rows the services write (sessions, tasks, facts, state, summaries, builds, experiences,
    digests): viewed and corrected here, never added by hand, since an added row would skip the
    service's event, audit and jobs."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False


class PolicyInline(admin.StackedInline):
    """A tenant's one row of a capability's policy (TenantPolicyBase), edited on the tenant page."""

    can_delete = False
    extra = 0
    max_num = 1


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]
    autocomplete_fields = ["user"]


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("name", "prefix", "scopes_shown", "created_at", "last_used_at", "expires_at", "revoked_at")
    readonly_fields = fields
    show_change_link = True
    can_delete = False

    @admin.display(description="scopes")
    def scopes_shown(self, obj: ApiKey) -> str:
        return scopes_text(obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Tenant)
class TenantAdmin(SavedOnlyFieldsMixin, admin.ModelAdmin):
    list_display = ["name", "slug", "is_active", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["created_at"]

    def get_inlines(self, request: HttpRequest, obj: Any) -> list[Any]:
        return [MembershipInline, ApiKeyInline, *POLICY_INLINES]


class ApiKeyAdminForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked = read and write. admin = everything, including managing keys via the API.",
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "scopes", "agent_external_id", "expires_at"]

    def clean_scopes(self) -> list[str]:
        return sorted(self.cleaned_data.get("scopes") or [])


@admin.register(ApiKey)
class ApiKeyAdmin(SavedOnlyFieldsMixin, admin.ModelAdmin):
    form = ApiKeyAdminForm
    list_display = [
        *["name", "tenant", "visible_prefix", "scopes_shown", "last_used_at", "expires_at", "status"]
    ]
    saved_only_fields = (*SavedOnlyFieldsMixin.saved_only_fields, "visible_prefix")
    list_filter = ["tenant"]
    list_select_related = ["tenant"]
    search_fields = ["name", "prefix", "tenant__slug"]
    readonly_fields = ["visible_prefix", "created_at", "last_used_at", "revoked_at"]
    fields = [
        *["tenant", "name", "scopes", "agent_external_id", "expires_at"],
        *["visible_prefix", "created_at", "last_used_at", "revoked_at"],
    ]
    actions = ["revoke"]

    @admin.display(description="key")
    def visible_prefix(self, obj: ApiKey) -> str:
        return f"ctx_{obj.prefix}_…" if obj.prefix else "(generated on save)"

    @admin.display(description="scopes")
    def scopes_shown(self, obj: ApiKey) -> str:
        return scopes_text(obj)

    @admin.display(description="status")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked_at:
            return "revoked"
        if obj.expires_at and obj.expires_at <= timezone.now():
            return "expired"
        return "active"

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        # A key's tenant never changes: moving a key would hand one tenant's access to another.
        return [*self.readonly_fields, "tenant"] if obj is not None else list(self.readonly_fields)

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, secret = api_key_create(
            tenant=obj.tenant,
            name=obj.name,
            scopes=list(obj.scopes or []),
            expires_at=obj.expires_at,
            agent_external_id=obj.agent_external_id,
            actor=f"admin user {request.user}",
        )
        # The admin goes on with `obj` (the change-page link, the log entry): make it the saved row.
        obj.pk = key.pk
        obj.refresh_from_db()
        messages.warning(
            request,
            f"The new API key is {secret} — copy it now: it is stored hashed and will not be shown again.",
        )

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        revoked = 0
        for key in queryset.select_related("tenant"):
            if key.revoked_at is None:
                api_key_revoke(api_key=key, actor=f"admin user {request.user}")
                revoked += 1
        self.message_user(request, f"Revoked {revoked} key(s); requests with them now answer 401.")


@admin.register(Membership)
class MembershipAdmin(SavedOnlyFieldsMixin, admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["tenant", "role"]
    list_select_related = ["user", "tenant"]
    search_fields = ["user__username", "user__email", "tenant__slug"]
    fields = ["user", "tenant", "role", "created_at"]
    readonly_fields = ["created_at"]
    autocomplete_fields = ["user", "tenant"]


# --- sessions (agent API and flight recorder) ----------------------------------------------------
from memory.models import Event, Session, SessionRetentionPolicy, Task  # noqa: E402


class SessionRetentionPolicyInline(PolicyInline):
    model = SessionRetentionPolicy


POLICY_INLINES.append(SessionRetentionPolicyInline)


@admin.register(Session)
class SessionAdmin(RecordAdmin):
    list_display = ["public_id", "tenant", "agent", "user_id", "status", "message_count", "last_accessed_at"]
    list_filter = ["tenant", "status"]
    search_fields = ["public_id", "agent__external_id", "user_id"]
    list_select_related = ["tenant", "agent"]
    readonly_fields = ["public_id", "message_seq", "message_count", "token_count", "created_at"]
    raw_id_fields = ["agent"]


@admin.register(Task)
class TaskAdmin(RecordAdmin):
    list_display = ["public_id", "tenant", "status", "value_tier", "created_at", "expires_at"]
    list_filter = ["tenant", "status"]
    search_fields = ["public_id", "user_id", "title"]
    raw_id_fields = ["session", "agent"]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """Read-only: the flight recorder is append-only."""

    list_display = ["stream", "seq", "type", "tenant", "created_at"]
    list_filter = ["tenant", "type"]
    search_fields = ["stream", "type", "public_id"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- decay ---------------------------------------------------------------------------------------
from memory.models import DecayPolicy, TrackedFact  # noqa: E402


class DecayPolicyInline(PolicyInline):
    model = DecayPolicy


POLICY_INLINES.append(DecayPolicyInline)


@admin.register(TrackedFact)
class TrackedFactAdmin(RecordAdmin):
    list_display = [
        "public_id",
        "key",
        "fact_type",
        "importance",
        "tenant",
        "last_referenced_round",
        "decayed",
    ]
    list_filter = ["tenant", "importance", "decayed"]
    search_fields = ["public_id", "key", "content"]
    list_select_related = ["tenant"]
    raw_id_fields = ["session"]
    readonly_fields = ["public_id", "embedding", "created_at", "updated_at"]


# --- cognition -----------------------------------------------------------------------------------
from memory.models import Checkpoint, CheckpointPolicy, CognitiveState  # noqa: E402
from memory.services.cognition import state_materialize_before_delete  # noqa: E402


class CheckpointPolicyInline(PolicyInline):
    model = CheckpointPolicy


POLICY_INLINES.append(CheckpointPolicyInline)


@admin.register(CognitiveState)
class CognitiveStateAdmin(RecordAdmin):
    list_display = ["agent", "tenant", "schema_version", "version", "checkpoint_seq", "updated_at"]
    list_filter = ["tenant"]
    search_fields = ["agent__external_id"]
    list_select_related = ["agent", "tenant"]
    readonly_fields = [
        "tenant", "agent", "schema_version", "document", "version",
        "checkpoint", "checkpoint_seq", "updated_at", "fold_seq", "fold_reducers_sha256",
    ]  # fmt: skip
    exclude = ["fold_state"]


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    """Read-only: checkpoints are immutable; retention prunes them."""

    list_display = ["public_id", "agent", "seq", "reason", "storage", "state_bytes", "created_at"]
    list_filter = ["tenant", "storage"]
    search_fields = ["public_id", "agent__external_id", "reason"]
    list_select_related = ["agent"]
    exclude = ["payload", "fold_state"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # An agent's current state may be stored only in its latest checkpoint (memory.services.cognition):
    # copy it onto the state row before deleting that checkpoint by hand.
    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        state_materialize_before_delete(checkpoint=obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for checkpoint in queryset:
            state_materialize_before_delete(checkpoint=checkpoint)
        super().delete_queryset(request, queryset)


# --- context engine ---------------------------------------------------------------------------
from memory.models import BudgetSample, ContextPolicy, ModelProfile, Summary, TokenUsageReport  # noqa: E402


class ContextPolicyInline(PolicyInline):
    model = ContextPolicy
    verbose_name_plural = "context policy"


class ModelProfileInline(admin.TabularInline):
    """The tenant's own models; a row named like a built-in model overrides it."""

    model = ModelProfile
    extra = 0
    fields = [
        "name", "provider", "input_limit", "output_limit", "tokenizer",
        "input_usd_per_mtok", "output_usd_per_mtok", "notes",
    ]  # fmt: skip


POLICY_INLINES.append(ContextPolicyInline)
POLICY_INLINES.append(ModelProfileInline)


@admin.register(Summary)
class SummaryAdmin(RecordAdmin):
    list_display = ["public_id", "session", "is_current", "covers_up_to_seq", "folded_count",
                    "tokens_before", "tokens_after", "method", "created_at"]  # fmt: skip
    list_filter = ["tenant", "is_current", "method"]
    search_fields = ["public_id", "session__public_id"]
    list_select_related = ["session"]
    readonly_fields = [f.name for f in Summary._meta.fields]


@admin.register(BudgetSample)
class BudgetSampleAdmin(RecordAdmin):
    list_display = ["public_id", "session", "model_name", "prompt_tokens", "input_limit", "utilisation",
                    "summarisation_queued", "created_at"]  # fmt: skip
    list_filter = ["tenant", "model_name"]
    search_fields = ["public_id", "session__public_id"]
    list_select_related = ["session"]
    readonly_fields = [f.name for f in BudgetSample._meta.fields]


@admin.register(TokenUsageReport)
class TokenUsageReportAdmin(RecordAdmin):
    list_display = ["model_name", "session", "estimated_input_tokens", "input_tokens", "cached_input_tokens",
                    "reasoning_tokens", "created_at"]  # fmt: skip
    list_filter = ["tenant", "model_name"]
    list_select_related = ["session"]


# --- experiences ---------------------------------------------------------------------------------
from memory.models import Experience, ExperiencePolicy  # noqa: E402


class ExperiencePolicyInline(PolicyInline):
    model = ExperiencePolicy


POLICY_INLINES.append(ExperiencePolicyInline)


@admin.register(Experience)
class ExperienceAdmin(RecordAdmin):
    list_display = [
        "public_id", "tenant", "kind", "extraction_method", "embedding_status", "confidence", "use_count",
        "last_used_at", "created_at",
    ]  # fmt: skip
    list_filter = ["tenant", "kind", "extraction_method", "embedding_status", "scope"]
    search_fields = ["public_id", "problem", "solution", "user_id", "agent"]
    list_select_related = ["tenant"]
    exclude = ["embedding", "problem_embedding"]
    readonly_fields = [
        "public_id", "text_hash", "embedding_model", "embedding_dimensions", "embedding_status",
        "embedding_error", "embedding_attempts", "embedded_at", "merged_into", "merged_at", "superseded_by",
        "superseded_at",
        "provenance", "use_count", "last_used_at", "helpful_count", "unhelpful_count", "merge_count",
        "aliases", "mergeable",
    ]  # fmt: skip
    raw_id_fields = ["source_task", "source_session"]


# --- session digests (medium-term memory) -------------------------------------------------------
from memory.models import SessionDigest  # noqa: E402


@admin.register(SessionDigest)
class SessionDigestAdmin(RecordAdmin):
    list_display = ["session", "version", "user_id", "method", "covers_up_to_seq", "created_at"]
    list_filter = ["tenant", "method"]
    search_fields = ["session__public_id", "user_id", "text"]
    list_select_related = ["session"]
    readonly_fields = [f.name for f in SessionDigest._meta.fields if f.name != "search_vector"]
    exclude = ["search_vector"]


# --- conversational memory (memory index, search, recall) -----------------------------------------

from memory.models import MemoryPolicy  # noqa: E402


class MemoryPolicyInline(PolicyInline):
    model = MemoryPolicy


POLICY_INLINES.append(MemoryPolicyInline)


# --- who may read whose text across agents (memory/services/sharing.py) ----------------------------

from memory.models import SharingPolicy  # noqa: E402


class SharingPolicyInline(PolicyInline):
    model = SharingPolicy


POLICY_INLINES.append(SharingPolicyInline)


# --- user memory ---------------------------------------------------------------------------------
from memory.models import UserMemory  # noqa: E402
from memory.services.user_memory.memories import user_memory_delete, user_scope  # noqa: E402


@admin.register(UserMemory)
class UserMemoryAdmin(RecordAdmin):
    """Read-only: a change is a new version (the API's PATCH), never an edit in place. Deleting
    goes through the service, so it erases the earlier versions and records its event."""

    list_display = [
        "public_id", "tenant", "user_id", "subject", "memory_type", "origin", "is_current",
        "embedding_status", "valid_from", "valid_to",
    ]  # fmt: skip
    list_filter = ["tenant", "memory_type", "origin", "embedding_status"]
    search_fields = ["public_id", "user_id", "subject", "text"]
    list_select_related = ["tenant"]
    exclude = ["embedding"]
    actions = ["erase"]

    @admin.display(boolean=True, description="current")
    def is_current(self, obj: UserMemory) -> bool:
        return obj.valid_to is None

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Django's bulk delete would skip the event and leave earlier versions: the `erase` action.
        return False

    @admin.action(description="Erase the selected memories and their earlier versions")
    def erase(self, request: HttpRequest, queryset: QuerySet[UserMemory]) -> None:
        erased = 0
        for memory in queryset.select_related("tenant").order_by("-valid_from"):
            if not UserMemory.objects.filter(pk=memory.pk).exists():  # went with a later one
                continue
            scope = user_scope(tenant=memory.tenant, user_id=memory.user_id)
            erased += len(user_memory_delete(scope=scope, memory_id=memory.public_id))
        self.message_user(request, f"Erased {erased} memories.")
