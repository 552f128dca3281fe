"""A span's token usage: read from its GenAI attributes, recorded as a usage report (outside
calibration: no build estimated the call) and a `usage.reported` event. Writes."""

from __future__ import annotations

from typing import Any

from memory.models import Session, Tenant, TokenUsageReport
from memory.services import recorder
from memory.services.otel_ingest.attributes import token_count


def span_usage(attrs: dict[str, Any]) -> dict[str, int | None]:
    input_tokens = token_count(
        attrs.get("gen_ai.usage.input_tokens", attrs.get("gen_ai.usage.prompt_tokens"))
    )
    output_tokens = token_count(
        attrs.get("gen_ai.usage.output_tokens", attrs.get("gen_ai.usage.completion_tokens"))
    )
    if input_tokens is None and output_tokens is None:
        return {}
    return {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.usage.cache_read.input_tokens": token_count(
            attrs.get("gen_ai.usage.cache_read.input_tokens")
        ),
        "gen_ai.usage.reasoning.output_tokens": token_count(
            attrs.get("gen_ai.usage.reasoning.output_tokens")
        ),
    }


def usage_record(
    *, tenant: Tenant, session: Session, model: str, usage: dict[str, int | None], span_hex: str
) -> None:
    # No context build was estimated for this call, so estimated_input_tokens is 0 and the report
    # is left out of calibration (model_profiles.usage_correction); it still counts as usage.
    input_tokens = usage["gen_ai.usage.input_tokens"] or 0
    cached = usage.get("gen_ai.usage.cache_read.input_tokens")
    TokenUsageReport.objects.create(
        tenant=tenant,
        session=session,
        budget_sample=None,
        model_name=(model or session.model_name)[:200],
        tokenizer="",
        estimated_input_tokens=0,
        input_tokens=input_tokens,
        output_tokens=usage.get("gen_ai.usage.output_tokens"),
        cached_input_tokens=cached if cached is None or cached <= input_tokens else None,
        reasoning_tokens=usage.get("gen_ai.usage.reasoning.output_tokens"),
    )
    recorder.event_append(
        tenant=tenant,
        type="usage.reported",
        session=session,
        payload={"source": "otel", "span_id": span_hex, **usage},
    )
