"""Model profiles: input/output limits and tokenizer of every model ctxapp knows.

Built-in profiles come from memory/data/models.json (the maintained table); a tenant's own
ModelProfile rows add models or override built-ins of the same name. An unknown model gets the
default window (CTXAPP_UNKNOWN_MODEL_INPUT_TOKENS, 64,000) and a warning. Read-only.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from memory.models import ModelProfile, Tenant, TokenUsageReport
from memory.services import tokens

DATA_PATH = Path(__file__).resolve().parent.parent / "data" / "models.json"
UNKNOWN_OUTPUT_LIMIT = 4096
USAGE_WINDOW = 50  # the latest reports per model that the usage correction uses


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # the name asked for
    profile: str  # the profile it matched ("" when unknown)
    provider: str
    input_limit: int
    output_limit: int
    tokenizer: str
    source: str  # "builtin" | "tenant" | "default"
    aliases: tuple[str, ...] = field(default_factory=tuple)

    @property
    def known(self) -> bool:
        return self.source != "default"

    @property
    def exact(self) -> bool:
        return self.tokenizer in tokens.RANK_URLS


@functools.cache
def builtin_table() -> dict[str, Any]:
    return json.loads(DATA_PATH.read_text())


@functools.cache
def _builtin_index() -> dict[str, dict[str, Any]]:
    index: dict[str, dict[str, Any]] = {}
    for row in builtin_table()["models"]:
        index[row["name"].lower()] = row
        for alias in row.get("aliases", []):
            index.setdefault(alias.lower(), row)
    return index


def family_factor(tokenizer: str) -> float:
    if tokenizer in tokens.RANK_URLS:
        return 1.0
    family = tokenizer.split(":", 1)[-1]
    return float(builtin_table().get("families", {}).get(family, 1.0))


def _from_builtin(name: str, row: dict[str, Any]) -> ResolvedModel:
    return ResolvedModel(
        name=name,
        profile=row["name"],
        provider=row["provider"],
        input_limit=int(row["input_limit"]),
        output_limit=int(row["output_limit"]),
        tokenizer=row["tokenizer"],
        source="builtin",
        aliases=tuple(row.get("aliases", [])),
    )


def _from_tenant(name: str, row: ModelProfile) -> ResolvedModel:
    return ResolvedModel(
        name=name,
        profile=row.name,
        provider=row.provider,
        input_limit=row.input_limit,
        output_limit=row.output_limit,
        tokenizer=row.tokenizer,
        source="tenant",
    )


def _match_builtin(name: str) -> dict[str, Any] | None:
    """Exact name or alias; else the longest known name that prefixes it (dated snapshots such as
    gpt-4o-2024-08-06 or claude-sonnet-4-20250514); provider prefixes like `openai/` are ignored."""
    index = _builtin_index()
    key = name.lower().rsplit("/", 1)[-1]
    if key in index:
        return index[key]
    best = None
    for known, row in index.items():
        is_prefix = key.startswith(known) and key[len(known) : len(known) + 1] in {"-", ":", "@", "."}
        if is_prefix and (best is None or len(known) > len(best[0])):
            best = (known, row)
    return best[1] if best else None


def model_profile_resolve(*, tenant: Tenant, name: str) -> ResolvedModel:
    """The profile for `name`: the tenant's own first, then built-in, else the unknown default."""
    if name:
        own = ModelProfile.objects.filter(tenant=tenant, name=name).first()
        if own is not None:
            return _from_tenant(name, own)
        row = _match_builtin(name)
        if row is not None:
            return _from_builtin(name, row)
    return ResolvedModel(
        name=name,
        profile="",
        provider="unknown",
        input_limit=settings.CTXAPP.unknown_model_input_tokens,
        output_limit=UNKNOWN_OUTPUT_LIMIT,
        tokenizer="estimate:generic",
        source="default",
    )


def model_profiles_list(*, tenant: Tenant) -> list[ResolvedModel]:
    """Every profile the tenant can use: built-ins, with the tenant's own replacing same-named ones."""
    own = {row.name: row for row in ModelProfile.objects.filter(tenant=tenant)}
    result = [
        _from_tenant(row["name"], own.pop(row["name"]))
        if row["name"] in own
        else _from_builtin(row["name"], row)
        for row in builtin_table()["models"]
    ]
    result += [_from_tenant(name, row) for name, row in sorted(own.items())]
    return result


def usage_correction(*, tenant: Tenant, model_name: str) -> tuple[float, int]:
    """(factor, reports): the median actual ÷ estimated input tokens over the latest USAGE_WINDOW
    reports for this tenant's model, clamped to tokens.CALIBRATION_BOUNDS; 1.0 below
    CTXAPP_CALIBRATION_MIN_REPORTS reports. Read-only."""
    rows = list(
        # Reports without an estimate (OpenTelemetry usage, no context build) cannot calibrate.
        TokenUsageReport.objects.filter(tenant=tenant, model_name=model_name, estimated_input_tokens__gt=0)
        .order_by("-created_at")
        .values_list("input_tokens", "estimated_input_tokens")[:USAGE_WINDOW]
    )
    if len(rows) < settings.CTXAPP.calibration_min_reports:
        return 1.0, len(rows)
    ratios = sorted(actual / estimated for actual, estimated in rows if estimated)
    if not ratios:
        return 1.0, len(rows)
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return tokens.clamp_factor(median), len(rows)


def counter_for(*, tenant: Tenant, model: ResolvedModel, calibrated: bool = True) -> tokens.TokenCounter:
    """The TokenCounter of a model: exact for OpenAI encodings; otherwise the calibrated estimate x
    family factor x the tenant's usage correction (when `calibrated`)."""
    if model.exact:
        return tokens.TokenCounter(model.tokenizer)
    factor = family_factor(model.tokenizer)
    if calibrated:
        factor *= usage_correction(tenant=tenant, model_name=model.name)[0]
    return tokens.TokenCounter(model.tokenizer, tokens.clamp_factor(factor))
