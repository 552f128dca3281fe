"""The one settings surface of ctxapp.

Every tunable is declared here once: its environment variable, type, default and a line of
documentation. `ctxapp/settings.py` reads them; `ctxapp config` prints their effective values
and where each came from; `docs/settings.md` is generated from this list
(`ctxapp config --markdown`).

Values come from, in order of precedence: the process environment, then the env file
(`CTXAPP_ENV_FILE`, default `./.env`), then the default. A value that does not parse fails at
start with the variable's name: ctxapp never guesses.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class SettingError(ValueError):
    """A setting's value could not be parsed. The message names the variable."""


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError("expected one of true/false, yes/no, on/off, 1/0")


def parse_int(raw: str) -> int:
    return int(raw.strip().replace("_", ""))


def parse_float(raw: str) -> float:
    return float(raw.strip())


def parse_list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def parse_str(raw: str) -> str:
    return raw


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    parse.__name__ = "choice"
    return parse


def parse_positive_float(raw: str) -> float:
    value = float(raw.strip())
    if not value > 0:
        raise ValueError("expected a number greater than 0")
    return value


def parse_fraction(raw: str) -> float:
    value = float(raw.strip())
    if not 0.0 <= value <= 1.0:
        raise ValueError("expected a number between 0 and 1")
    return value


def parse_port(raw: str) -> int:
    value = int(raw.strip())
    if not 0 < value < 65536:
        raise ValueError("expected a TCP port between 1 and 65535")
    return value


def parse_rate(raw: str) -> str | None:
    """A request rate `N/unit` (unit: s, min, h, day), or `off`."""
    value = raw.strip().lower()
    if value in {"off", "none", ""}:
        return None
    count, _, unit = value.partition("/")
    if not count.isdigit() or int(count) <= 0 or unit[:1] not in {"s", "m", "h", "d"}:
        raise ValueError("expected a rate such as 600/min, 20/s, 10000/h or 'off'")
    return value


def parse_positive_int(raw: str) -> int:
    value = parse_int(raw)
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


def parse_networks(raw: str) -> list[str]:
    """Comma-separated IP networks (CIDR, or single addresses), each checked."""
    import ipaddress

    networks = parse_list(raw)
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ValueError(f"{network!r} is not an IP network (e.g. 10.0.0.0/8 or 127.0.0.1)") from None
    return networks


TYPE_NAMES: dict[Callable[[str], Any], str] = {
    parse_bool: "bool",
    parse_int: "int",
    parse_positive_int: "positive int",
    parse_float: "float",
    parse_fraction: "fraction 0..1",
    parse_positive_float: "positive number",
    parse_list: "comma-separated list",
    parse_str: "string",
    parse_port: "port",
    parse_networks: "comma-separated CIDR list",
    parse_rate: "rate (N/s|min|h|day, or off)",
}


@dataclass(frozen=True)
class Setting:
    env: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    secret: bool = False
    group: str = "core"

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.parse, getattr(self.parse, "__name__", "string"))


@dataclass(frozen=True)
class Resolved:
    setting: Setting
    value: Any
    source: str  # "default" | "environment" | "file"

    def display(self) -> str:
        return mask(self.setting, self.value)


def mask(setting: Setting, value: Any) -> str:
    if value is None or value == "":
        return "(unset)"
    if isinstance(value, list):
        return ",".join(value)
    text = str(value)
    if setting.secret:
        return "****" + (text[-4:] if len(text) > 12 else "")
    if "://" in text:
        return mask_url(text)
    return text


def mask_url(url: str) -> str:
    """Hide the password of a URL, keep everything else readable."""
    parts = urlsplit(url)
    if parts.password:
        netloc = f"{parts.username}:****@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    return url


SETTINGS: list[Setting] = [
    # --- core ----------------------------------------------------------------------------------
    Setting("CTXAPP_DEBUG", parse_bool, False, "Django debug mode. Never on in production."),
    Setting(
        "CTXAPP_SECRET_KEY",
        parse_str,
        "",
        "Django secret key. Unset: generated once and kept in the data directory (embedded mode).",
        secret=True,
    ),
    Setting(
        "CTXAPP_ALLOWED_HOSTS",
        parse_list,
        ["localhost", "127.0.0.1", "[::1]"],
        "Host names this server answers to.",
    ),
    Setting(
        "CTXAPP_CSRF_TRUSTED_ORIGINS",
        parse_list,
        [],
        "Origins trusted for dashboard form posts behind a proxy, e.g. https://ctx.example.com.",
    ),
    Setting(
        "CTXAPP_DATA_DIR",
        parse_str,
        "./.ctxapp",
        "Where the embedded PostgreSQL, the secret key and the lock file live. Unset, `ctxapp` uses the "
        "nearest .ctxapp in the current directory or one above it (as git finds .git), else ./.ctxapp.",
    ),
    Setting(
        "DATABASE_URL",
        parse_str,
        "",
        "PostgreSQL with pgvector, e.g. postgresql://user:pass@host:5432/ctxapp. "
        "Unset: ctxapp runs its embedded PostgreSQL in the data directory.",
    ),
    Setting(
        "REDIS_URL",
        parse_str,
        "",
        "Redis for the Celery broker and the Channels layer. "
        "Unset: both run on the PostgreSQL database (see docs/run-modes.md).",
    ),
    Setting("CTXAPP_HOST", parse_str, "127.0.0.1", "Interface the web server of `ctxapp up` binds."),
    Setting("CTXAPP_PORT", parse_port, 8000, "Port the web server of `ctxapp up` binds."),
    Setting("CTXAPP_WEB_WORKERS", parse_positive_int, 1, "ASGI server processes started by `ctxapp up`."),
    Setting(
        "CTXAPP_WORKER_CONCURRENCY",
        parse_positive_int,
        2,
        "Celery worker processes started by `ctxapp up`.",
    ),
    Setting("CTXAPP_LOG_LEVEL", parse_choice("debug", "info", "warning", "error"), "info", "Log level."),
    Setting(
        "CTXAPP_QUEUE_PREFIX",
        parse_str,
        "ctxapp",
        "Prefix of Celery queue names and channel groups; lets several installations share one Redis.",
    ),
    Setting(
        "CTXAPP_JOB_SWEEP_SECONDS",
        parse_positive_float,
        15.0,
        "How often Celery beat sweeps the job intents: re-dispatches jobs whose broker message was "
        "lost or never sent, and jobs whose worker died (the bound on recovery after a worker is killed).",
    ),
    Setting(
        "CTXAPP_JOB_REDISPATCH_SECONDS",
        parse_positive_float,
        60.0,
        "A job intent not taken by a worker this long after it was dispatched is dispatched again "
        "(a broker outage or a broker that lost its messages). Duplicates are harmless.",
    ),
    Setting(
        "CTXAPP_JOB_KEEP_DAYS",
        parse_positive_int,
        7,
        "Finished job intents (done or failed) are kept this many days for the jobs page.",
    ),
    Setting(
        "CTXAPP_BROKER_POLL_SECONDS",
        parse_positive_float,
        0.1,
        "Without REDIS_URL: how often a Celery worker polls PostgreSQL for new jobs (the longest wait "
        "before a job starts).",
    ),
    Setting(
        "CTXAPP_BROKER_VISIBILITY_TIMEOUT",
        parse_positive_int,
        3600,
        "Seconds after which a job taken by a worker that never acknowledged it (the worker was "
        "killed) is delivered again. Longer than the longest job.",
    ),
    Setting(
        "CTXAPP_DB_POOL_SIZE",
        parse_int,
        20,
        "Most database connections each process keeps in its psycopg pool (0 = no pool: a new "
        "connection per request). Budget PostgreSQL's max_connections for every web and worker process.",
    ),
    # --- API -----------------------------------------------------------------------------------
    Setting(
        "CTXAPP_MAX_BODY_BYTES",
        parse_positive_int,
        64 * 1024 * 1024,
        "Largest request body accepted; larger → 413.",
        group="api",
    ),
    Setting(
        "CTXAPP_MESSAGE_MAX_BYTES",
        parse_positive_int,
        1024 * 1024,
        "Largest content of one message (UTF-8 bytes); larger → 422.",
        group="api",
    ),
    Setting(
        "CTXAPP_BATCH_MAX_MESSAGES",
        parse_positive_int,
        1000,
        "Most messages in one batch append.",
        group="api",
    ),
    Setting(
        "CTXAPP_EVENT_PAYLOAD_MAX_BYTES",
        parse_positive_int,
        256 * 1024,
        "Largest payload of an agent-emitted event (JSON bytes).",
        group="api",
    ),
    Setting(
        "CTXAPP_THROTTLE_KEY_RATE",
        parse_rate,
        "1200/min",
        "Requests per API key; more → 429 with Retry-After.",
        group="api",
    ),
    Setting(
        "CTXAPP_THROTTLE_ADDRESS_RATE",
        parse_rate,
        "2400/min",
        "API requests per client address (all its keys together); more → 429 with Retry-After.",
        group="api",
    ),
    Setting(
        "CTXAPP_THROTTLE_AUTH_FAILURE_RATE",
        parse_rate,
        "30/min",
        "Failed API authentications (401) per client address; past it every request from that address "
        "answers 429 until the window passes (guessing keys).",
        group="api",
    ),
    Setting(
        "CTXAPP_NUM_PROXIES",
        parse_int,
        0,
        "Reverse proxies in front of ctxapp that append to X-Forwarded-For; 0 = the socket's address is "
        "the client's (throttles and login lockouts count per client address).",
        group="api",
    ),
    Setting(
        "CTXAPP_LOGIN_FAILURE_LIMIT",
        parse_positive_int,
        5,
        "Failed admin or dashboard logins per username and address before that pair is locked out.",
        group="api",
    ),
    Setting(
        "CTXAPP_LOGIN_COOLOFF_MINUTES",
        parse_positive_int,
        15,
        "How long a login lockout lasts.",
        group="api",
    ),
    Setting(
        "CTXAPP_HTTPS",
        parse_bool,
        False,
        "Served over HTTPS (behind a TLS proxy): HSTS for a year and Secure session and CSRF cookies. "
        "See docs/production.md.",
    ),
    Setting(
        "CTXAPP_JSON_MAX_DEPTH",
        parse_positive_int,
        100,
        "Deepest nesting of objects and arrays accepted in a JSON body; deeper → 422.",
        group="api",
    ),
    Setting(
        "CTXAPP_IDEMPOTENCY_TTL_HOURS",
        parse_positive_int,
        24,
        "How long a stored Idempotency-Key response is replayed.",
        group="api",
    ),
    Setting("CTXAPP_PAGE_SIZE", parse_positive_int, 100, "Default page size of list endpoints.", group="api"),
    Setting(
        "CTXAPP_API_KEY_TOUCH_SECONDS",
        parse_positive_int,
        60,
        "An API key's last-used time is written at most this often.",
        group="api",
    ),
    Setting(
        "CTXAPP_API_KEY_CACHE_SECONDS",
        parse_float,
        5.0,
        "How long a web process reuses an API-key lookup (0 = look it up on every request). "
        "Revocation, expiry and tenant changes on this host drop every process's cache at once; "
        "a web process on another host notices them within this time.",
        group="api",
    ),
    # --- experiences -----------------------------------------------------------------------------
    Setting(
        "CTXAPP_EMBEDDER",
        parse_choice("local", "openai"),
        "local",
        "Embedder of experiences: `local` (all-MiniLM-L6-v2 int8 ONNX, in-process) or `openai` "
        "(any OpenAI-compatible /embeddings endpoint, CTXAPP_EMBEDDING_URL).",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_URL",
        parse_str,
        "",
        "Base URL of an OpenAI-compatible embeddings API, e.g. https://api.openai.com/v1 "
        "(CTXAPP_EMBEDDER=openai).",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_MODEL",
        parse_str,
        "text-embedding-3-small",
        "Model name sent to the embeddings endpoint; it must return 384 dimensions.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_API_KEY",
        parse_str,
        "",
        "Bearer key of the embeddings endpoint.",
        secret=True,
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_TIMEOUT",
        parse_float,
        30.0,
        "Seconds to wait for the embeddings endpoint.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EXPERIENCES_BULK_MAX",
        parse_positive_int,
        1000,
        "Most experiences in one POST /api/v1/experiences/bulk; more → 422.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_BATCH_SIZE",
        parse_positive_int,
        64,
        "Pending experiences embedded per Celery job.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_MAX_RETRIES",
        parse_int,
        5,
        "Retries of an embedding job on a transient error before its experiences are marked failed.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_RETRY_BACKOFF",
        parse_float,
        5.0,
        "Seconds before the first retry of an embedding job; doubles each retry (capped at 10 minutes).",
        group="experiences",
    ),
    Setting(
        "CTXAPP_EMBEDDING_STALE_MINUTES",
        parse_positive_int,
        15,
        "A pending experience older than this is re-queued by the embedding sweep (lost job).",
        group="experiences",
    ),
    Setting(
        "CTXAPP_MEMORY_EMBED_BATCH",
        parse_positive_int,
        64,
        "Pending messages, summaries and facts one embedding batch of the memory index embeds.",
        group="memory",
    ),
    Setting(
        "CTXAPP_MEMORY_DRAIN_SECONDS",
        parse_float,
        20.0,
        "A memory-index drain job embeds batches for about this long, then hands over to a new job.",
        group="memory",
    ),
    Setting(
        "CTXAPP_MEMORY_INDEX_STALE_SECONDS",
        parse_positive_int,
        120,
        "The memory-index sweep (every minute) re-dispatches messages pending for longer than this.",
        group="memory",
    ),
    Setting(
        "CTXAPP_DISTILL_LLM",
        parse_bool,
        True,
        "Full distillation also asks the summariser's chat endpoint (CTXAPP_SUMMARISER_URL, model, key, "
        "timeout, retries) to extract experiences, when that endpoint is set.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_DIGEST_LLM",
        parse_bool,
        True,
        "The session digest (medium-term memory) is written by the summariser's chat endpoint when "
        "CTXAPP_SUMMARISER_URL is set; false keeps the offline extractor.",
        group="experiences",
    ),
    Setting(
        "CTXAPP_DIGEST_MAX_ITEMS",
        parse_positive_int,
        8,
        "Most items kept per category of a session digest (the newest win).",
        group="experiences",
    ),
    # --- cognition -----------------------------------------------------------------------------
    Setting(
        "CTXAPP_RECOVERY_PART_TIMEOUT_MS",
        parse_positive_int,
        2000,
        "Deadline of each part of a recovered state (fold, checkpoint, session, tasks, events); "
        "a part that misses it is left out with a warning.",
        group="cognition",
    ),
    Setting(
        "CTXAPP_RECOVERY_HISTORY_MESSAGES",
        parse_positive_int,
        20,
        "Recent messages of the latest session included in a recovered state.",
        group="cognition",
    ),
    Setting(
        "CTXAPP_RECOVERY_MAX_EVENTS",
        parse_positive_int,
        500,
        "Most events-after-the-last-checkpoint listed in a recovered state (the fold covers all).",
        group="cognition",
    ),
    Setting(
        "CTXAPP_STATE_MAX_BYTES",
        parse_positive_int,
        4 * 1024 * 1024,
        "Largest cognitive state or private context (JSON bytes); larger → 413.",
        group="cognition",
    ),
    # --- context -------------------------------------------------------------------------------
    Setting(
        "CTXAPP_UNKNOWN_MODEL_INPUT_TOKENS",
        parse_positive_int,
        64000,
        "Input window assumed for a model not in the profile table (a warning says so).",
        group="context",
    ),
    Setting(
        "CTXAPP_CALIBRATION_MIN_REPORTS",
        parse_positive_int,
        3,
        "Usage reports of a model needed before its estimated token counts are corrected by them.",
        group="context",
    ),
    Setting(
        "CTXAPP_SUMMARISER_URL",
        parse_str,
        "",
        "Base URL of an OpenAI-compatible chat API (POST {url}/chat/completions) that writes session "
        "summaries. Unset: the offline extractive summariser.",
        group="context",
    ),
    Setting(
        "CTXAPP_SUMMARISER_MODEL",
        parse_str,
        "gpt-4o-mini",
        "Chat model that writes summaries.",
        group="context",
    ),
    Setting(
        "CTXAPP_SUMMARISER_API_KEY",
        parse_str,
        "",
        "Bearer key of the summariser endpoint.",
        secret=True,
        group="context",
    ),
    Setting(
        "CTXAPP_SUMMARISER_TIMEOUT",
        parse_float,
        30.0,
        "Seconds to wait for the summariser endpoint.",
        group="context",
    ),
    Setting(
        "CTXAPP_SUMMARISER_RETRIES",
        parse_int,
        2,
        "Extra attempts at the summariser endpoint before falling back to the offline summariser.",
        group="context",
    ),  # --- dashboard ---
    Setting(
        "CTXAPP_DASHBOARD_FLUSH_MS",
        parse_positive_int,
        400,
        "Live dashboard: events are coalesced and each page is re-rendered at most once per this many ms.",
        group="dashboard",
    ),
    # --- metrics ---
    Setting(
        "CTXAPP_METRICS_TOKEN",
        parse_str,
        "",
        "Bearer token that may read GET /metrics from any address. Unset: only CTXAPP_METRICS_ALLOW.",
        secret=True,
        group="metrics",
    ),
    Setting(
        "CTXAPP_METRICS_ALLOW",
        parse_networks,
        ["127.0.0.1/32", "::1/128"],
        "Client networks (CIDR) that may read GET /metrics without the token. Empty: token only.",
        group="metrics",
    ),
    # --- client (`ctxapp ctx`, `ctxapp mcp`, `ctxapp demo`) ---
    Setting(
        "CTXAPP_URL",
        parse_str,
        "",
        "Base URL the command-line clients call. Unset: the config file, then the server `ctxapp up` "
        "runs from this data directory, then http://127.0.0.1:CTXAPP_PORT.",
        group="client",
    ),
    Setting(
        "CTXAPP_API_KEY",
        parse_str,
        "",
        "API key the command-line clients send. Unset: api_key in ~/.config/ctxapp/config.toml.",
        secret=True,
        group="client",
    ),
    Setting(
        "CTXAPP_CHANNEL_GROUP_EXPIRY",
        parse_positive_int,
        300,
        "Live dashboard: seconds a page's membership of its tenant's channel group lasts unless "
        "renewed (open pages renew it every third of this); a page whose process died stops "
        "receiving events after this.",
        group="dashboard",
    ),
]


def env_file_path() -> Path:
    return Path(os.environ.get("CTXAPP_ENV_FILE", ".env"))


def _file_values() -> dict[str, str]:
    path = env_file_path()
    if not path.is_file():
        return {}
    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def resolve_all(environ: dict[str, str] | None = None) -> dict[str, Resolved]:
    """Resolve every setting. Raises SettingError naming the first variable that does not parse."""
    env = os.environ if environ is None else environ
    file_values = _file_values()
    resolved: dict[str, Resolved] = {}
    for setting in SETTINGS:
        if setting.env in env:
            raw, source = env[setting.env], "environment"
        elif setting.env in file_values:
            raw, source = file_values[setting.env], f"file {env_file_path()}"
        else:
            resolved[setting.env] = Resolved(setting, setting.default, "default")
            continue
        try:
            value = setting.parse(raw)
        except (ValueError, TypeError) as exc:
            raise SettingError(f"{setting.env}={raw!r} is not a valid {setting.type_name}: {exc}") from None
        resolved[setting.env] = Resolved(setting, value, source)
    return resolved


def markdown_table(resolved: dict[str, Resolved] | None = None) -> str:
    """The settings reference, as docs/settings.md shows it."""
    lines = [
        "| variable | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for setting in SETTINGS:
        default = mask(setting, setting.default) if not setting.secret else "(generated)"
        lines.append(f"| `{setting.env}` | {setting.type_name} | `{default}` | {setting.doc} |")
    return "\n".join(lines)
