"""Every setting of ctxapp: `CtxappSettings`, the server's settings (`ctxapp.conf.server`) and the
capabilities' (experiences, memory, cognition, context, dashboard, metrics, client) below.

`SETTINGS` lists their declarations in order: `ctxapp config` and docs/settings.md follow it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ctxapp.conf.parsers import (
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_networks,
    parse_non_negative_int,
    parse_positive_int,
    parse_str,
)
from ctxapp.conf.server import ServerSettings
from ctxapp.conf.spec import Setting, setting


@dataclass(frozen=True, kw_only=True)
class CtxappSettings(ServerSettings):
    """The effective settings, `django.conf.settings.CTXAPP`. A test overrides values with
    `settings.CTXAPP = dataclasses.replace(settings.CTXAPP, job_keep_days=1)`."""

    # --- experiences -------------------------------------------------------------------------------
    embedder: str = setting(
        "CTXAPP_EMBEDDER",
        parse_choice("local", "openai"),
        "local",
        "Embedder of experiences: `local` (all-MiniLM-L6-v2 int8 ONNX, in-process) or `openai` "
        "(any OpenAI-compatible /embeddings endpoint, CTXAPP_EMBEDDING_URL).",
        group="experiences",
    )
    embedding_url: str = setting(
        "CTXAPP_EMBEDDING_URL",
        parse_str,
        "",
        "Base URL of an OpenAI-compatible embeddings API, e.g. https://api.openai.com/v1 "
        "(CTXAPP_EMBEDDER=openai).",
        group="experiences",
    )
    embedding_model: str = setting(
        "CTXAPP_EMBEDDING_MODEL",
        parse_str,
        "text-embedding-3-small",
        "Model name sent to the embeddings endpoint; it must return 384 dimensions.",
        group="experiences",
    )
    embedding_api_key: str = setting(
        "CTXAPP_EMBEDDING_API_KEY",
        parse_str,
        "",
        "Bearer key of the embeddings endpoint.",
        secret=True,
        group="experiences",
    )
    embedding_timeout: float = setting(
        "CTXAPP_EMBEDDING_TIMEOUT",
        parse_float,
        30.0,
        "Seconds to wait for the embeddings endpoint.",
        group="experiences",
    )
    experiences_bulk_max: int = setting(
        "CTXAPP_EXPERIENCES_BULK_MAX",
        parse_positive_int,
        1000,
        "Most experiences in one POST /api/v1/experiences/bulk; more → 422.",
        group="experiences",
    )
    embedding_batch_size: int = setting(
        "CTXAPP_EMBEDDING_BATCH_SIZE",
        parse_positive_int,
        64,
        "Pending experiences embedded per Celery job.",
        group="experiences",
    )
    embedding_call_retries: int = setting(
        "CTXAPP_EMBEDDING_CALL_RETRIES",
        parse_non_negative_int,
        3,
        "CTXAPP_EMBEDDER=openai: retries of one call to the endpoint (a batch of at most 64 texts) on "
        "a timeout, a refused connection, HTTP 429 or 5xx, after 0.5 s doubling, or the Retry-After "
        "the endpoint sends (up to 10 s; longer is left to the job's retries below).",
        group="experiences",
    )
    embedding_max_retries: int = setting(
        "CTXAPP_EMBEDDING_MAX_RETRIES",
        parse_int,
        5,
        "Retries of an embedding job on a transient error before its experiences are marked failed.",
        group="experiences",
    )
    embedding_retry_backoff: float = setting(
        "CTXAPP_EMBEDDING_RETRY_BACKOFF",
        parse_float,
        5.0,
        "Seconds before the first retry of an embedding job; doubles each retry (capped at 10 minutes).",
        group="experiences",
    )
    embedding_stale_minutes: int = setting(
        "CTXAPP_EMBEDDING_STALE_MINUTES",
        parse_positive_int,
        15,
        "A pending experience older than this is re-queued by the embedding sweep (lost job).",
        group="experiences",
    )
    distill_llm: bool = setting(
        "CTXAPP_DISTILL_LLM",
        parse_bool,
        True,
        "Full distillation also asks the summariser's chat endpoint (CTXAPP_SUMMARISER_URL, model, key, "
        "timeout, retries) to extract experiences, when that endpoint is set.",
        group="experiences",
    )
    digest_llm: bool = setting(
        "CTXAPP_DIGEST_LLM",
        parse_bool,
        True,
        "The session digest (medium-term memory) is written by the summariser's chat endpoint when "
        "CTXAPP_SUMMARISER_URL is set; false keeps the offline extractor.",
        group="experiences",
    )
    digest_max_items: int = setting(
        "CTXAPP_DIGEST_MAX_ITEMS",
        parse_positive_int,
        8,
        "Most items kept per category of a session digest (the newest win).",
        group="experiences",
    )
    # --- memory ------------------------------------------------------------------------------------
    memory_embed_batch: int = setting(
        "CTXAPP_MEMORY_EMBED_BATCH",
        parse_positive_int,
        64,
        "Pending messages, summaries and facts one embedding batch of the memory index embeds.",
        group="memory",
    )
    memory_drain_seconds: float = setting(
        "CTXAPP_MEMORY_DRAIN_SECONDS",
        parse_float,
        20.0,
        "A memory-index drain job embeds batches for about this long, then hands over to a new job.",
        group="memory",
    )
    memory_index_stale_seconds: int = setting(
        "CTXAPP_MEMORY_INDEX_STALE_SECONDS",
        parse_positive_int,
        120,
        "The memory-index sweep (every minute) re-dispatches messages pending for longer than this.",
        group="memory",
    )
    # --- cognition ---------------------------------------------------------------------------------
    recovery_part_timeout_ms: int = setting(
        "CTXAPP_RECOVERY_PART_TIMEOUT_MS",
        parse_positive_int,
        2000,
        "Deadline of each part of a recovered state (fold, checkpoint, session, tasks, events); "
        "a part that misses it is left out with a warning.",
        group="cognition",
    )
    recovery_history_messages: int = setting(
        "CTXAPP_RECOVERY_HISTORY_MESSAGES",
        parse_positive_int,
        20,
        "Recent messages of the latest session included in a recovered state.",
        group="cognition",
    )
    recovery_max_events: int = setting(
        "CTXAPP_RECOVERY_MAX_EVENTS",
        parse_positive_int,
        500,
        "Most events-after-the-last-checkpoint listed in a recovered state (the fold covers all).",
        group="cognition",
    )
    state_max_bytes: int = setting(
        "CTXAPP_STATE_MAX_BYTES",
        parse_positive_int,
        4 * 1024 * 1024,
        "Largest cognitive state or private context (JSON bytes); larger → 413.",
        group="cognition",
    )
    # --- context -----------------------------------------------------------------------------------
    unknown_model_input_tokens: int = setting(
        "CTXAPP_UNKNOWN_MODEL_INPUT_TOKENS",
        parse_positive_int,
        64000,
        "Input window assumed for a model not in the profile table (a warning says so).",
        group="context",
    )
    calibration_min_reports: int = setting(
        "CTXAPP_CALIBRATION_MIN_REPORTS",
        parse_positive_int,
        3,
        "Usage reports of a model needed before its estimated token counts are corrected by them.",
        group="context",
    )
    summariser_url: str = setting(
        "CTXAPP_SUMMARISER_URL",
        parse_str,
        "",
        "Base URL of an OpenAI-compatible chat API (POST {url}/chat/completions) that writes session "
        "summaries. Unset: the offline extractive summariser.",
        group="context",
    )
    summariser_model: str = setting(
        "CTXAPP_SUMMARISER_MODEL",
        parse_str,
        "gpt-4o-mini",
        "Chat model that writes summaries.",
        group="context",
    )
    summariser_api_key: str = setting(
        "CTXAPP_SUMMARISER_API_KEY",
        parse_str,
        "",
        "Bearer key of the summariser endpoint.",
        secret=True,
        group="context",
    )
    summariser_timeout: float = setting(
        "CTXAPP_SUMMARISER_TIMEOUT",
        parse_float,
        30.0,
        "Seconds to wait for the summariser endpoint.",
        group="context",
    )
    summariser_retries: int = setting(
        "CTXAPP_SUMMARISER_RETRIES",
        parse_int,
        2,
        "Extra attempts at the summariser endpoint before falling back to the offline summariser.",
        group="context",
    )
    # --- dashboard ---------------------------------------------------------------------------------
    dashboard_flush_ms: int = setting(
        "CTXAPP_DASHBOARD_FLUSH_MS",
        parse_positive_int,
        400,
        "Live dashboard: events are coalesced and each page is re-rendered at most once per this many ms.",
        group="dashboard",
    )
    channel_group_expiry: int = setting(
        "CTXAPP_CHANNEL_GROUP_EXPIRY",
        parse_positive_int,
        300,
        "Live dashboard: seconds a page's membership of its tenant's channel group lasts unless "
        "renewed (open pages renew it every third of this); a page whose process died stops "
        "receiving events after this.",
        group="dashboard",
    )
    # --- metrics -----------------------------------------------------------------------------------
    metrics_token: str = setting(
        "CTXAPP_METRICS_TOKEN",
        parse_str,
        "",
        "Bearer token that may read GET /metrics from any address. Unset: only CTXAPP_METRICS_ALLOW.",
        secret=True,
        group="metrics",
    )
    metrics_allow: list[str] = setting(
        "CTXAPP_METRICS_ALLOW",
        parse_networks,
        ["127.0.0.1/32", "::1/128"],
        "Client networks (CIDR) that may read GET /metrics without the token. Empty: token only.",
        group="metrics",
    )
    # --- client ------------------------------------------------------------------------------------
    url: str = setting(
        "CTXAPP_URL",
        parse_str,
        "",
        "Base URL the command-line clients call. Unset: the config file, then the server `ctxapp up` "
        "runs from this data directory, then http://127.0.0.1:CTXAPP_PORT.",
        group="client",
    )
    api_key: str = setting(
        "CTXAPP_API_KEY",
        parse_str,
        "",
        "API key the command-line clients send. Unset: api_key in ~/.config/ctxapp/config.toml.",
        secret=True,
        group="client",
    )


SETTINGS: tuple[Setting, ...] = tuple(
    field.metadata["setting"] for field in dataclasses.fields(CtxappSettings)
)

for _field in dataclasses.fields(CtxappSettings):
    if _field.name != _field.metadata["setting"].name:  # the rule the attribute names follow
        raise TypeError(f"CtxappSettings.{_field.name} must be named {_field.metadata['setting'].name}")
