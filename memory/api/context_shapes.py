"""Output shapes of the context engine: a model profile, a context policy, a built context.

The services return dataclasses (`ResolvedModel`, `EffectivePolicy`, `RecallPolicy`,
`BuiltContext`); these serializers render them for every adapter that shows them (the REST views,
the MCP server, the CLI through the client), and describe each field to the OpenAPI schema. A
build's manifest, budget, warnings and forecast are the documents the build also stores
(`BudgetSample`): `InOrder` renders each in its own key order, so the answer is the stored
document, and the schema still names each field.
"""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from memory.api.shapes import IsoDateTimeField, fields_of
from memory.models import MessageRole
from memory.services.context import COMPONENTS, BuiltContext

# --- a model profile ------------------------------------------------------------------------------


class ResolvedModelSerializer(serializers.Serializer):
    name = serializers.CharField(help_text="The name asked for.")
    profile = serializers.CharField(help_text="The profile it matched (empty when unknown).")
    provider = serializers.CharField()
    input_limit = serializers.IntegerField()
    output_limit = serializers.IntegerField()
    tokenizer = serializers.CharField()
    source = serializers.ChoiceField(choices=["builtin", "tenant", "default"])  # type: ignore[assignment]
    aliases = serializers.ListField(child=serializers.CharField())
    known = serializers.BooleanField(help_text="False: not in the profile table (the default window).")
    exact = serializers.BooleanField(help_text="True: counted with the model's own tokenizer.")


ModelOutputSerializer = fields_of(
    ResolvedModelSerializer,
    "ModelOutput",
    "name",
    "provider",
    "input_limit",
    "output_limit",
    "tokenizer",
    "exact",
    "source",
    "aliases",
)


class UsageCalibrationSerializer(serializers.Serializer):
    reports = serializers.IntegerField(help_text="Provider usage reports for the model.")
    factor = serializers.FloatField(help_text="Median reported ÷ estimated input tokens.")
    applied = serializers.BooleanField(help_text="Whether estimates for the model use the factor.")


class ModelDetailSerializer(ModelOutputSerializer):  # type: ignore[valid-type,misc]
    """One model profile with the profile it matched and, given as the `calibration` context, the
    tenant's usage calibration of it."""

    matched_profile = serializers.CharField(source="profile")
    usage_calibration = serializers.SerializerMethodField()

    @extend_schema_field(UsageCalibrationSerializer)
    def get_usage_calibration(self, model: Any) -> dict[str, Any]:
        factor, reports = self.context["calibration"]
        return {"reports": reports, "factor": factor, "applied": not model.exact and factor != 1.0}


# --- the context policy ---------------------------------------------------------------------------


class ModePartsSerializer(serializers.Serializer):
    system_parts = serializers.ListField(
        child=serializers.CharField(), help_text='The system parts the mode sends (names, or "*").'
    )
    tools = serializers.BooleanField(help_text="Whether the mode sends the tools.")


@extend_schema_field(serializers.DictField(child=ModePartsSerializer()))
class ModePartsField(serializers.JSONField):
    """The tenant's modes as stored (admin-edited JSON, shown as it is), described per mode."""


class EffectivePolicySerializer(serializers.Serializer):
    history_window = serializers.IntegerField()
    summarise_threshold = serializers.FloatField()
    keep_verbatim = serializers.IntegerField()
    output_reserve = serializers.IntegerField()
    char_gate = serializers.IntegerField()
    memory_limit = serializers.IntegerField()
    memory_max_chars = serializers.IntegerField()
    near_limit = serializers.FloatField()
    middle_start = serializers.FloatField()
    middle_end = serializers.FloatField()
    mode = serializers.CharField()
    summary_max_tokens = serializers.IntegerField()
    user_profile_share = serializers.FloatField(help_text="Share of the budget the user's memories may use.")
    user_profile_max_tokens = serializers.IntegerField(help_text="Cap on the user's memories, in tokens.")
    max_input_tokens = serializers.IntegerField(allow_null=True)
    mode_parts = ModePartsField()
    default_model = serializers.CharField()


class RecallPolicySerializer(serializers.Serializer):
    enabled = serializers.BooleanField()
    top_k = serializers.IntegerField()
    min_score = serializers.FloatField()
    min_similarity = serializers.FloatField()
    position = serializers.ChoiceField(choices=["start", "end"])
    budget_share = serializers.FloatField()
    max_tokens = serializers.IntegerField()


class BuildPolicySerializer(EffectivePolicySerializer):
    """The effective policy of one build, with its recall policy."""

    recall = RecallPolicySerializer()


# --- a built context ------------------------------------------------------------------------------


class InOrder(serializers.Serializer):
    """A stored JSON document: its declared fields, in the document's own key order, an optional
    field only when the document has it. A key the serializer does not declare is passed on as it
    is rather than dropped (tests/memory/api/test_context_shapes.py fails on it, so it gets
    declared)."""

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        return {key: data[key] if key in data else instance[key] for key in instance}


class PromptMessageSerializer(InOrder):
    role = serializers.ChoiceField(choices=MessageRole.choices)
    content = serializers.JSONField(allow_null=True, help_text="A string, content parts, or null.")
    tool_calls = serializers.ListField(
        child=serializers.DictField(), required=False, help_text="As the message was appended."
    )
    tool_call_id = serializers.CharField(required=False)
    name = serializers.CharField(required=False)


class ProfileMemorySerializer(InOrder):
    id = serializers.CharField(help_text="The user memory's id.")
    subject = serializers.CharField()
    type = serializers.CharField()
    score = serializers.FloatField(help_text="0.5 relevance + 0.3 type priority + 0.2 confidence.")
    relevance = serializers.FloatField(help_text="0..1 to the input: shared words or meaning.")
    confidence = serializers.FloatField()
    agent = serializers.CharField(help_text="The agent whose session it came from ('' for none).")
    tokens = serializers.IntegerField(help_text="Its line in the block.")
    included = serializers.BooleanField()
    reason = serializers.CharField(help_text="Why it was chosen or left out.")


class ManifestItemSerializer(InOrder):
    kind = serializers.ChoiceField(
        choices=[
            "system_part",
            "tools",
            "user_profile",
            "pinned_fact",
            "memory",
            "recall",
            "summary",
            "history",
            "open_questions",
            "input",
        ]
    )
    id = serializers.CharField()
    component = serializers.ChoiceField(choices=[c for c in COMPONENTS if c != "overhead"])
    tokens = serializers.IntegerField()
    score = serializers.FloatField(allow_null=True)
    critical = serializers.BooleanField()
    required = serializers.BooleanField(help_text="Never dropped to fit the budget.")  # type: ignore[assignment]
    included = serializers.BooleanField()
    reason = serializers.CharField(help_text="Why it was included or left out.")
    group = serializers.CharField(required=False, help_text="A tool-call group, kept or dropped whole.")
    offset = serializers.IntegerField(required=False, help_text="Its first token in the prompt.")
    count = serializers.IntegerField(required=False, help_text="tools: how many.")
    importance = serializers.CharField(required=False, help_text="pinned_fact")
    restated = serializers.BooleanField(required=False, help_text="pinned_fact: restated after decay.")
    covers_up_to_seq = serializers.IntegerField(required=False, help_text="summary")
    source = serializers.CharField(  # type: ignore[assignment]
        required=False,
        help_text="recall: message | summary | fact | experience | user_memory; a previous session's digest: "
        "its origin.",
    )
    source_id = serializers.CharField(required=False, help_text="recall: the recalled item's id.")
    session = serializers.CharField(
        required=False, allow_null=True, help_text="recall, a previous session's digest"
    )
    agent = serializers.CharField(required=False, help_text="a previous session's digest")
    seq = serializers.IntegerField(required=False, allow_null=True, help_text="history, recall")
    seqs = serializers.ListField(
        child=serializers.IntegerField(), required=False,
        help_text="recall: every turn a message excerpt quotes, in conversation order.",
    )  # fmt: skip
    role = serializers.CharField(required=False, help_text="history")
    occurred_at = serializers.CharField(required=False, allow_null=True, help_text="recall")
    contributions = serializers.DictField(
        child=serializers.FloatField(), required=False, help_text="recall: each ranking signal's share."
    )
    position = serializers.FloatField(
        required=False, help_text="Critical items: where in the prompt it starts (0..1)."
    )
    risky = serializers.BooleanField(
        required=False, help_text="Critical items: starts in the policy's middle band."
    )
    allowance_tokens = serializers.IntegerField(
        required=False, help_text="user_profile: the tokens its share of the budget allows."
    )
    memories = ProfileMemorySerializer(
        many=True,
        required=False,
        help_text="user_profile: the memories chosen and the best 20 left out, best first, each with why.",
    )
    memories_not_listed = serializers.IntegerField(
        required=False, help_text="user_profile: further memories left out (ranked below those listed)."
    )


class UsageCorrectionSerializer(serializers.Serializer):
    factor = serializers.FloatField(help_text="Applied to estimates (1.0 for an exact tokenizer).")
    reports = serializers.IntegerField(help_text="Provider usage reports behind the factor.")


class ManifestSerializer(InOrder):
    items = ManifestItemSerializer(many=True)
    total_tokens = serializers.IntegerField()
    priming_tokens = serializers.IntegerField()
    history_outside_window = serializers.IntegerField(
        help_text="History messages neither in the window nor in the summary."
    )
    usage_correction = UsageCorrectionSerializer()
    counting = serializers.CharField()


BudgetComponentsSerializer = cast(
    type[serializers.Serializer],
    type(
        "BudgetComponentsSerializer",
        (InOrder,),
        {name: serializers.IntegerField() for name in COMPONENTS},
    ),
)


class BudgetSerializer(InOrder):
    components = BudgetComponentsSerializer(help_text="Prompt tokens per component.")
    prompt_tokens = serializers.IntegerField()
    demand_tokens = serializers.IntegerField(help_text="Tokens of every candidate, before the fit.")
    input_limit = serializers.IntegerField()
    output_reserve = serializers.IntegerField()
    budget_tokens = serializers.IntegerField(help_text="input_limit - output_reserve")
    remaining_tokens = serializers.IntegerField()
    threshold_tokens = serializers.IntegerField(help_text="Summarisation starts at this demand.")
    utilisation = serializers.FloatField(help_text="prompt_tokens / input_limit")
    exact = serializers.BooleanField()
    tokenizer = serializers.CharField()
    estimate_factor = serializers.FloatField(allow_null=True)


class BuildWarningSerializer(InOrder):
    code = serializers.CharField()
    message = serializers.CharField()
    item = serializers.CharField(required=False, help_text="critical_in_middle: the item's id.")
    offset = serializers.IntegerField(required=False, help_text="critical_in_middle")
    position = serializers.FloatField(required=False, help_text="critical_in_middle")
    prompt_tokens = serializers.IntegerField(required=False, help_text="near_limit")
    budget_tokens = serializers.IntegerField(required=False, help_text="near_limit")
    count = serializers.IntegerField(required=False, help_text="history_dropped")
    facts = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="restated_facts: their ids."
    )


class ForecastSerializer(InOrder):
    growth_tokens_per_turn = serializers.FloatField()
    basis = serializers.ChoiceField(choices=["builds", "history"])
    turns_until_summarisation = serializers.IntegerField(allow_null=True)
    turns_until_window = serializers.IntegerField(allow_null=True)


class SummarisationSerializer(serializers.Serializer):
    queued = serializers.BooleanField()
    already_queued = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True)
    threshold = serializers.FloatField()
    covered_up_to_seq = serializers.IntegerField()


class BuiltContextSerializer(serializers.Serializer):
    build_id = serializers.CharField()
    session = serializers.SerializerMethodField(help_text="The session the context was built for.")
    model = ResolvedModelSerializer()
    messages = PromptMessageSerializer(many=True, help_text="The prompt, in placement order.")
    tools = serializers.ListField(
        child=serializers.DictField(), help_text="The tools as given (empty when the mode sends none)."
    )
    manifest = ManifestSerializer()
    budget = BudgetSerializer()
    warnings = BuildWarningSerializer(many=True)
    forecast = ForecastSerializer()
    summarisation = SummarisationSerializer()
    policy = serializers.SerializerMethodField()

    @extend_schema_field(BuildPolicySerializer)
    def get_policy(self, built: BuiltContext) -> dict[str, Any]:
        return {
            **EffectivePolicySerializer(built.policy).data,
            "recall": RecallPolicySerializer(built.recall_policy).data,
        }

    def get_session(self, built: BuiltContext) -> str:
        return str(self.context["session"])


# --- a recorded build (BudgetSample) -----------------------------------------------------------


def stored(shape: Any) -> type[serializers.JSONField]:
    """A JSON column shown as stored (a row written by an older version keeps its shape), and
    described to the schema as `shape`, the shape builds record it in."""
    return cast(
        type[serializers.JSONField],
        extend_schema_field(shape)(type(f"Stored{type(shape).__name__}", (serializers.JSONField,), {})),
    )


class BudgetSampleSerializer(serializers.Serializer):
    build_id = serializers.CharField(source="public_id")
    created_at = IsoDateTimeField()
    model = serializers.CharField(source="model_name")
    prompt_tokens = serializers.IntegerField()
    demand_tokens = serializers.IntegerField()
    input_limit = serializers.IntegerField()
    output_reserve = serializers.IntegerField()
    threshold_tokens = serializers.IntegerField()
    utilisation = serializers.FloatField()
    components = stored(BudgetComponentsSerializer())()
    warnings = stored(BuildWarningSerializer(many=True))()
    forecast = stored(ForecastSerializer())()
    summarisation_queued = serializers.BooleanField()
    manifest = stored(ManifestSerializer())()


class BudgetSamplesSerializer(serializers.Serializer):
    builds = BudgetSampleSerializer(many=True, help_text="Newest first.")


def built_context_out(built: BuiltContext, *, session: str) -> dict[str, Any]:
    """A built context, as POST /sessions/{id}/context and the MCP tool answer it. It names its
    session, so erasing the session also erases a stored copy of this answer (Idempotency-Key)."""
    return cast(dict[str, Any], BuiltContextSerializer(built, context={"session": session}).data)
