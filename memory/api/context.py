"""Context engine API: token counts, model profiles, context builds, usage, policy, summaries."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.base import BodySerializer, TenantApiView
from memory.api.context_shapes import (
    BudgetSamplesSerializer,
    BuiltContextSerializer,
    EffectivePolicySerializer,
    ModelDetailSerializer,
    ModelOutputSerializer,
    built_context_out,
)
from memory.api.message_inputs import MessageTextField
from memory.exceptions import InvalidInput, NotFound
from memory.models import Session, SessionContextPolicy
from memory.services import context, jobs, model_profiles, rolling_summary, tokens
from memory.services.sessions import session_access

MAX_TOKENS = 2**31 - 1  # the usage columns are PostgreSQL integers: larger answered 500

# --- tokens -----------------------------------------------------------------------------------------


class ChatMessageSerializer(BodySerializer):
    json_unbounded_fields = frozenset({"content"})  # the prompt itself
    role = serializers.ChoiceField(choices=["system", "user", "assistant", "tool", "developer"])
    content = serializers.JSONField(required=False, allow_null=True)
    name = serializers.CharField(required=False, allow_blank=True)
    tool_calls = serializers.ListField(child=serializers.DictField(), required=False)
    tool_call_id = serializers.CharField(required=False, allow_blank=True)

    def validate_content(self, value: Any) -> Any:
        if value is None or isinstance(value, (str, list)):
            return value
        raise serializers.ValidationError("Expected a string, a list of content parts, or null.")


class TokensCountApi(TenantApiView):
    """Count tokens of a text or a chat prompt for a model. Read-only (needs only `read`)."""

    required_scope = "read"

    @extend_schema_serializer(component_name="TokensCountInput")
    class InputSerializer(BodySerializer):
        text = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
        messages = ChatMessageSerializer(many=True, required=False)
        tools = serializers.ListField(child=serializers.DictField(), required=False)
        model = serializers.CharField(required=False, allow_blank=True, default="gpt-4o")

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if ("text" in attrs) == ("messages" in attrs):
                raise serializers.ValidationError({"text": ["Give exactly one of text or messages."]})
            return attrs

    @extend_schema_serializer(component_name="TokensCountOutput")
    class OutputSerializer(serializers.Serializer):
        tokens = serializers.IntegerField()
        exact = serializers.BooleanField()
        tokenizer = serializers.CharField()
        model = serializers.CharField()
        model_known = serializers.BooleanField()
        content_type = serializers.CharField(allow_null=True)
        estimate_factor = serializers.FloatField(allow_null=True)
        counting = serializers.CharField()
        warnings = serializers.ListField(child=serializers.DictField())

    @extend_schema(request=InputSerializer, responses=OutputSerializer, summary="Count tokens for a model")
    def post(self, request: Any) -> Response:
        data = self.validate(self.InputSerializer)
        model = model_profiles.model_profile_resolve(tenant=self.tenant, name=data.get("model") or "")
        counter = model_profiles.counter_for(tenant=self.tenant, model=model)
        warnings = []
        if not model.known:
            warnings.append(
                {
                    "code": "unknown_model",
                    "message": (
                        f"Model {model.name!r} is not in the profile table"
                        if model.name
                        else "No model was set"
                    )
                    + "; counted with the generic estimate.",
                }
            )
        if "text" in data:
            count, content_type = (
                counter.count(data["text"]),
                None if counter.exact else tokens.content_type_of(data["text"]),
            )
            counting = "tokens of the text"
        else:
            messages = [dict(m) for m in data["messages"]]
            count, content_type = counter.prompt_tokens(messages, data.get("tools")), None
            counting = (
                "3 tokens per message + role + content (+ name, tool_calls JSON, tool_call_id) "
                "+ 3 reply priming + compact JSON of tool schemas"
            )
        return Response(
            self.OutputSerializer(
                {
                    "tokens": count,
                    "exact": counter.exact,
                    "tokenizer": counter.tokenizer,
                    "model": model.name,
                    "model_known": model.known,
                    "content_type": content_type,
                    "estimate_factor": None if counter.exact else counter.factor,
                    "counting": counting,
                    "warnings": warnings,
                }
            ).data
        )


# --- models -----------------------------------------------------------------------------------------


class ModelsApi(TenantApiView):
    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema(
        responses=inline_serializer(
            "ModelList",
            {
                "models": ModelOutputSerializer(many=True),
                "source": serializers.CharField(),
                "as_of": serializers.CharField(),
                "unknown_model_input_limit": serializers.IntegerField(),
            },
        ),
        parameters=[OpenApiParameter("provider", str, required=False)],
        summary="Model profiles: built-in and the tenant's own (which override built-ins)",
    )
    def get(self, request: Any) -> Response:
        provider = request.query_params.get("provider")
        rows = model_profiles.model_profiles_list(tenant=self.tenant)
        if provider:
            rows = [m for m in rows if m.provider == provider]
        table = model_profiles.builtin_table()
        return Response(
            {
                "models": ModelOutputSerializer(rows, many=True).data,
                "source": table["source"],
                "as_of": table["as_of"],
                "unknown_model_input_limit": settings.CTXAPP.unknown_model_input_tokens,
            }
        )


class ModelDetailApi(TenantApiView):
    @extend_schema(responses=ModelDetailSerializer, summary="One model profile, with its usage calibration")
    def get(self, request: Any, name: str) -> Response:
        model = model_profiles.model_profile_resolve(tenant=self.tenant, name=name)
        if not model.known:
            raise NotFound.of("model", name)
        calibration = model_profiles.usage_correction(tenant=self.tenant, model_name=model.name)
        return Response(ModelDetailSerializer(model, context={"calibration": calibration}).data)


# --- context builds ----------------------------------------------------------------------------------


class SystemPartSerializer(BodySerializer):
    name = serializers.CharField(max_length=100)
    content = serializers.CharField(trim_whitespace=False)
    critical = serializers.BooleanField(default=False)


class SessionContextApi(TenantApiView):
    """Build the next prompt for a session (POST), or list its recent builds (GET)."""

    @extend_schema_serializer(component_name="ContextBuildInput")
    class InputSerializer(BodySerializer):
        input = MessageTextField(
            required=False, allow_blank=True, trim_whitespace=False, default="",
            help_text="The upcoming user message; at most CTXAPP_MESSAGE_MAX_BYTES of UTF-8, as a message.",
        )  # fmt: skip
        model = serializers.CharField(
            required=False,
            allow_blank=True,
            default="",
            max_length=Session._meta.get_field("model_name").max_length,
        )
        system_parts = SystemPartSerializer(many=True, required=False)
        tools = serializers.ListField(child=serializers.DictField(), required=False)
        open_questions = serializers.ListField(child=serializers.CharField(), required=False)
        next_actions = serializers.ListField(child=serializers.CharField(), required=False)
        budget = serializers.DictField(required=False, help_text="Policy overrides for this build only.")
        mode = serializers.ChoiceField(choices=["agent", "ask", "plan"], required=False)
        recall = serializers.DictField(
            required=False,
            help_text="Recall overrides for this build: enabled, top_k, min_score, min_similarity, "
            "position (start|end), budget_share, max_tokens, relative_gap, query (default: the input).",
        )
        query = serializers.CharField(
            required=False, allow_blank=True, help_text="What to recall for (default: the input)."
        )

        def validate_budget(self, value: dict[str, Any]) -> dict[str, Any]:
            return context.policy_overrides_validate(value, field_name="budget")  # InvalidInput: 422

        def to_internal_value(self, data: Any) -> Any:
            # system_parts may also be given as {"core": "...", "tools": "..."}
            if isinstance(data, dict) and isinstance(data.get("system_parts"), dict):
                data = {
                    **data,
                    "system_parts": [{"name": k, "content": v} for k, v in data["system_parts"].items()],
                }
            return super().to_internal_value(data)

    @extend_schema(
        request=InputSerializer,
        responses=BuiltContextSerializer,
        summary="Build the next prompt's context within the model's budget",
    )
    def post(self, request: Any, session_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        overrides = dict(data.get("budget") or {})
        if data.get("mode"):
            overrides["mode"] = data["mode"]
        built = context.context_build(
            tenant=self.tenant,
            session=session,
            next_input=data["input"],
            model_name=data["model"],
            system_parts=[context.SystemPart(**p) for p in data.get("system_parts", [])],
            tools=data.get("tools"),
            open_questions=data.get("open_questions"),
            next_actions=data.get("next_actions"),
            overrides=overrides,
            recall={**(data.get("recall") or {}), **({"query": data["query"]} if data.get("query") else {})}
            or None,
        )
        return Response(built_context_out(built, session=session.public_id))

    @extend_schema(
        parameters=[OpenApiParameter("limit", int, required=False)],
        responses=BudgetSamplesSerializer,
        summary="The session's latest builds",
    )
    def get(self, request: Any, session_id: str) -> Response:
        session = session_access(tenant=self.tenant, session_id=session_id)
        try:
            limit = max(1, min(200, int(request.query_params.get("limit", 20))))
        except ValueError:
            raise InvalidInput(details={"fields": {"limit": ["Expected an integer."]}}) from None
        samples = context.budget_samples_list(tenant=self.tenant, session=session, limit=limit)
        return Response(BudgetSamplesSerializer({"builds": samples}).data)


class SessionUsageApi(TenantApiView):
    """Report the provider's usage for a built context (OpenTelemetry GenAI names, or OpenAI's `usage`)."""

    @extend_schema_serializer(component_name="UsageReportInput")
    class InputSerializer(BodySerializer):
        build_id = serializers.CharField(required=False, allow_blank=True)
        usage = serializers.DictField(
            required=False, help_text="OpenAI-style usage object, as the API returned it."
        )

        def get_fields(self) -> dict[str, Any]:
            fields = super().get_fields()
            fields["gen_ai.usage.input_tokens"] = serializers.IntegerField(
                min_value=0, max_value=MAX_TOKENS, required=False
            )
            fields["gen_ai.usage.output_tokens"] = serializers.IntegerField(
                min_value=0, max_value=MAX_TOKENS, required=False
            )
            fields["gen_ai.usage.cache_read.input_tokens"] = serializers.IntegerField(
                min_value=0, max_value=MAX_TOKENS, required=False
            )
            fields["gen_ai.usage.reasoning.output_tokens"] = serializers.IntegerField(
                min_value=0, max_value=MAX_TOKENS, required=False
            )
            return fields

    @staticmethod
    def _numbers(data: dict[str, Any]) -> dict[str, int | None]:
        usage_otel = (data.get("gen_ai") or {}).get("usage") or {}
        if usage_otel.get("input_tokens") is not None:
            return {
                "input_tokens": usage_otel["input_tokens"],
                "output_tokens": usage_otel.get("output_tokens"),
                "cached_input_tokens": (usage_otel.get("cache_read") or {}).get("input_tokens"),
                "reasoning_tokens": (usage_otel.get("reasoning") or {}).get("output_tokens"),
            }
        usage = data.get("usage") or {}

        def number(value: Any, name: str) -> int | None:
            if value is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOKENS:
                raise InvalidInput(details={"fields": {f"usage.{name}": [f"Expected 0 to {MAX_TOKENS}."]}})
            return value

        if "prompt_tokens" not in usage and "input_tokens" not in usage:
            raise InvalidInput(
                "Give gen_ai.usage.input_tokens (or an OpenAI-style usage object with prompt_tokens).",
                details={"fields": {"gen_ai.usage.input_tokens": ["This field is required."]}},
            )
        return {
            "input_tokens": number(usage.get("prompt_tokens", usage.get("input_tokens")), "prompt_tokens"),
            "output_tokens": number(
                usage.get("completion_tokens", usage.get("output_tokens")), "completion_tokens"
            ),
            "cached_input_tokens": number(
                (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                "prompt_tokens_details.cached_tokens",
            ),
            "reasoning_tokens": number(
                (usage.get("completion_tokens_details") or {}).get("reasoning_tokens"),
                "completion_tokens_details.reasoning_tokens",
            ),
        }

    @extend_schema(
        request=InputSerializer,
        responses={201: OpenApiTypes.OBJECT},
        summary="Report the provider's token usage of a built context",
    )
    def post(self, request: Any, session_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        numbers = self._numbers(data)
        report = context.context_usage_record(
            tenant=self.tenant,
            session=session,
            build_id=data.get("build_id") or None,
            **numbers,  # type: ignore[arg-type]
        )
        factor, reports = model_profiles.usage_correction(tenant=self.tenant, model_name=report.model_name)
        return Response(
            {
                "build_id": report.budget_sample.public_id if report.budget_sample else None,
                "model": report.model_name,
                "estimated_input_tokens": report.estimated_input_tokens,
                "gen_ai.usage.input_tokens": report.input_tokens,
                "gen_ai.usage.output_tokens": report.output_tokens,
                "gen_ai.usage.cache_read.input_tokens": report.cached_input_tokens,
                "gen_ai.usage.reasoning.output_tokens": report.reasoning_tokens,
                "error_pct": round(
                    (report.estimated_input_tokens - report.input_tokens) / report.input_tokens * 100, 2
                )
                if report.input_tokens
                else None,
                "calibration": {
                    "reports": reports,
                    "factor": factor,
                    "applies_to_estimates": report.tokenizer not in tokens.RANK_URLS,
                },
            },
            status=201,
        )


SESSION_CONTEXT_POLICY_OUT = inline_serializer(
    "SessionContextPolicy",
    {
        "overrides": serializers.DictField(help_text="The session's own overrides (policy keys)."),
        "effective": EffectivePolicySerializer(help_text="The tenant's policy under the overrides."),
    },
)


class SessionContextPolicyApi(TenantApiView):
    """The session's policy overrides (PUT replaces them) and the effective policy."""

    @extend_schema_serializer(component_name="SessionContextPolicyInput")
    class InputSerializer(BodySerializer):
        overrides = serializers.DictField()

        def validate_overrides(self, value: dict[str, Any]) -> dict[str, Any]:
            return context.policy_overrides_validate(value, field_name="overrides")  # InvalidInput: 422

    def _body(self, session: Session) -> dict[str, Any]:
        stored = (
            SessionContextPolicy.objects.filter(session=session).values_list("overrides", flat=True).first()
        )
        return {
            "overrides": stored or {},
            "effective": EffectivePolicySerializer(
                context.context_policy_effective(tenant=self.tenant, session=session)
            ).data,
        }

    @extend_schema(
        responses=SESSION_CONTEXT_POLICY_OUT,
        summary="The session's context policy (overrides and effective values)",
    )
    def get(self, request: Any, session_id: str) -> Response:
        return Response(self._body(session_access(tenant=self.tenant, session_id=session_id)))

    @extend_schema(
        request=InputSerializer,
        responses=SESSION_CONTEXT_POLICY_OUT,
        summary="Replace the session's context policy overrides",
    )
    def put(self, request: Any, session_id: str) -> Response:
        data = self.validate(self.InputSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        context.session_context_policy_set(tenant=self.tenant, session=session, overrides=data["overrides"])
        return Response(self._body(session))


class SessionSummariesApi(TenantApiView):
    """List the session's summaries (GET); queue summarisation now (POST, 202)."""

    schema_is_list = True  # its GET lists (OpenAPI operation id `…_list`)

    @extend_schema(responses=OpenApiTypes.OBJECT, summary="The session's rolling summaries, current first")
    def get(self, request: Any, session_id: str) -> Response:
        session = session_access(tenant=self.tenant, session_id=session_id)
        return Response(
            {
                "summaries": [
                    {
                        "id": s.public_id,
                        "is_current": s.is_current,
                        "text": s.text,
                        "tokens": s.tokens,
                        "covers_up_to_seq": s.covers_up_to_seq,
                        "folded_from_seq": s.folded_from_seq,
                        "folded_to_seq": s.folded_to_seq,
                        "folded_count": s.folded_count,
                        "tokens_before": s.tokens_before,
                        "tokens_after": s.tokens_after,
                        "method": s.method,
                        "error": s.error,
                        "created_at": s.created_at.isoformat(),
                    }
                    for s in rolling_summary.summaries_list(tenant=self.tenant, session=session)
                ]
            }
        )

    @extend_schema(
        request=None, responses={202: OpenApiTypes.OBJECT}, summary="Queue summarisation of the session now"
    )
    def post(self, request: Any, session_id: str) -> Response:
        session = session_access(tenant=self.tenant, session_id=session_id)
        with transaction.atomic():
            jobs.job_enqueue(
                tenant=self.tenant,
                kind=jobs.SUMMARISE,
                key=f"session:{session.pk}",
                payload={"session": session.pk},
            )
        return Response({"queued": True, "session": session.public_id}, status=202)


urlpatterns = [
    path("tokens/count", TokensCountApi.as_view(), name="api-tokens-count"),
    path("models", ModelsApi.as_view(), name="api-models"),
    path("models/<str:name>", ModelDetailApi.as_view(), name="api-model-detail"),
    path("sessions/<str:session_id>/context", SessionContextApi.as_view(), name="api-session-context"),
    path("sessions/<str:session_id>/usage", SessionUsageApi.as_view(), name="api-session-usage"),
    path(
        "sessions/<str:session_id>/context-policy",
        SessionContextPolicyApi.as_view(),
        name="api-session-context-policy",
    ),
    path("sessions/<str:session_id>/summaries", SessionSummariesApi.as_view(), name="api-session-summaries"),
]
