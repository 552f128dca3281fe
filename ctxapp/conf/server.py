"""Settings of the server itself (groups `core` and `api`): processes, database, broker, jobs and the
HTTP edge. The capabilities' settings extend these in `ctxapp.conf.declarations`.

Each attribute is declared once, with `setting(...)`: its environment variable, parser, default,
documentation, secrecy and group. The attribute is the variable in snake case without `CTXAPP_`
(`CTXAPP_JOB_KEEP_DAYS` → `job_keep_days`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ctxapp.conf.parsers import (
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
    parse_list,
    parse_non_negative_int,
    parse_port,
    parse_positive_float,
    parse_positive_int,
    parse_rate,
    parse_str,
)
from ctxapp.conf.spec import setting


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    # --- core --------------------------------------------------------------------------------------
    debug: bool = setting(
        "CTXAPP_DEBUG",
        parse_bool,
        False,
        "Django debug mode. Never on in production.",
    )
    secret_key: str = setting(
        "CTXAPP_SECRET_KEY",
        parse_str,
        "",
        "Django secret key. Unset: generated once and kept in the data directory (embedded mode).",
        secret=True,
    )
    allowed_hosts: list[str] = setting(
        "CTXAPP_ALLOWED_HOSTS",
        parse_list,
        ["localhost", "127.0.0.1", "[::1]"],
        "Host names this server answers to.",
    )
    csrf_trusted_origins: list[str] = setting(
        "CTXAPP_CSRF_TRUSTED_ORIGINS",
        parse_list,
        [],
        "Origins trusted for dashboard form posts behind a proxy, e.g. https://ctx.example.com.",
    )
    data_dir: str = setting(
        "CTXAPP_DATA_DIR",
        parse_str,
        "./.ctxapp",
        "Where the embedded PostgreSQL, the secret key and the lock file live. Unset, `ctxapp` uses the "
        "nearest .ctxapp in the current directory or one above it (as git finds .git), else ./.ctxapp.",
    )
    database_url: str = setting(
        "DATABASE_URL",
        parse_str,
        "",
        "PostgreSQL with pgvector, e.g. postgresql://user:pass@host:5432/ctxapp. "
        "Unset: ctxapp runs its embedded PostgreSQL in the data directory.",
    )
    database_replica_url: str = setting(
        "DATABASE_REPLICA_URL",
        parse_str,
        "",
        "A streaming replica of DATABASE_URL's server (same database, same pgvector): memory searches, "
        "context-build history reads and dashboard pages of HTTP requests that have not written read "
        "from it. Unset: every read goes to DATABASE_URL. See docs/production.md, Read replica.",
    )
    replica_max_lag_seconds: float = setting(
        "CTXAPP_REPLICA_MAX_LAG_SECONDS",
        parse_positive_float,
        5.0,
        "With DATABASE_REPLICA_URL: a replica further behind the primary than this (or unreachable) "
        "is not read from; reads go to the primary and /readyz says degraded.",
    )
    redis_url: str = setting(
        "REDIS_URL",
        parse_str,
        "",
        "Redis for the Celery broker, the Channels layer and the cache (throttles, login lockouts), "
        "e.g. redis://host:6379/0. Unset: `ctxapp up` runs its own Redis engine in the data directory "
        "(see docs/run-modes.md).",
    )
    host: str = setting(
        "CTXAPP_HOST",
        parse_str,
        "127.0.0.1",
        "Interface the web server of `ctxapp up` binds.",
    )
    port: int = setting(
        "CTXAPP_PORT",
        parse_port,
        8000,
        "Port the web server of `ctxapp up` binds.",
    )
    web_workers: int = setting(
        "CTXAPP_WEB_WORKERS",
        parse_positive_int,
        1,
        "ASGI server processes started by `ctxapp up`.",
    )
    worker_concurrency: int = setting(
        "CTXAPP_WORKER_CONCURRENCY",
        parse_positive_int,
        2,
        "Tasks the Celery worker runs at once (threads or processes of its pool).",
    )
    worker_pool: str = setting(
        "CTXAPP_WORKER_POOL",
        parse_choice("threads", "prefork", "solo"),
        "threads",
        "The Celery worker's pool (`ctxapp up`, `ctxapp worker`); CTXAPP_WORKER_CONCURRENCY is its size. "
        "threads: no pool process whose death can wedge the others (prefork's can), and measured the "
        "fastest here; docs/reliability.md has the comparison.",
    )
    embedded_shared_buffers_mb: int = setting(
        "CTXAPP_EMBEDDED_SHARED_BUFFERS_MB",
        parse_non_negative_int,
        0,
        "Without DATABASE_URL: the embedded PostgreSQL's shared_buffers, in MB (0 = a quarter of "
        "this machine's memory, between 128 and 2048). Applied when the server starts. A server of "
        "your own is configured in its own postgresql.conf.",
    )
    log_level: str = setting(
        "CTXAPP_LOG_LEVEL",
        parse_choice("debug", "info", "warning", "error"),
        "info",
        "Log level.",
    )
    queue_prefix: str = setting(
        "CTXAPP_QUEUE_PREFIX",
        parse_str,
        "ctxapp",
        "Prefix of Celery queue names and channel groups; lets several installations share one Redis.",
    )
    job_sweep_seconds: float = setting(
        "CTXAPP_JOB_SWEEP_SECONDS",
        parse_positive_float,
        15.0,
        "How often Celery beat sweeps the job intents: re-dispatches jobs whose broker message was "
        "lost or never sent, and jobs whose worker died (the bound on recovery after a worker is killed).",
    )
    job_redispatch_seconds: float = setting(
        "CTXAPP_JOB_REDISPATCH_SECONDS",
        parse_positive_float,
        60.0,
        "A job intent not taken by a worker this long after it was dispatched is dispatched again "
        "(a broker outage or a broker that lost its messages). Duplicates are harmless.",
    )
    job_heartbeat_deadline_seconds: float = setting(
        "CTXAPP_JOB_HEARTBEAT_DEADLINE_SECONDS",
        parse_positive_float,
        60.0,
        "A worker whose heartbeat job (sent every 10 s) has not run for this long is stalled: /readyz "
        "says so, the liveness probe of docs/production.md fails and `ctxapp up` restarts it. Several "
        "beats, so a worker busy with long jobs on every pool process is not called wedged.",
    )
    job_keep_days: int = setting(
        "CTXAPP_JOB_KEEP_DAYS",
        parse_positive_int,
        7,
        "Finished job intents (done or failed) are kept this many days for the jobs page.",
    )
    broker_visibility_timeout: int = setting(
        "CTXAPP_BROKER_VISIBILITY_TIMEOUT",
        parse_positive_int,
        3600,
        "Seconds after which a job taken by a worker that never acknowledged it (the worker was "
        "killed) is delivered again by Redis. Longer than the longest job.",
    )
    db_pool_size: int = setting(
        "CTXAPP_DB_POOL_SIZE",
        parse_int,
        20,
        "Most database connections each process keeps in its psycopg pool (0 = no pool: a new "
        "connection per request). Budget PostgreSQL's max_connections for every web and worker process.",
    )
    https: bool = setting(
        "CTXAPP_HTTPS",
        parse_bool,
        False,
        "Served over HTTPS (behind a TLS proxy): HSTS for a year and Secure session and CSRF cookies. "
        "See docs/production.md.",
    )
    # --- api ---------------------------------------------------------------------------------------
    max_body_bytes: int = setting(
        "CTXAPP_MAX_BODY_BYTES",
        parse_positive_int,
        64 * 1024 * 1024,
        "Largest request body accepted; larger → 413.",
        group="api",
    )
    max_json_field_bytes: int = setting(
        "CTXAPP_MAX_JSON_FIELD_BYTES",
        parse_positive_int,
        64 * 1024,
        "Largest free JSON value of a request field (session, task and experience `metadata`, "
        "OpenAI-style `usage`, …) as compact UTF-8 JSON; larger → 422 `validation_error` naming the field.",
        group="api",
    )
    message_max_bytes: int = setting(
        "CTXAPP_MESSAGE_MAX_BYTES",
        parse_positive_int,
        1024 * 1024,
        "Largest content of one message (UTF-8 bytes); larger → 422.",
        group="api",
    )
    batch_max_messages: int = setting(
        "CTXAPP_BATCH_MAX_MESSAGES",
        parse_positive_int,
        1000,
        "Most messages in one batch append.",
        group="api",
    )
    event_payload_max_bytes: int = setting(
        "CTXAPP_EVENT_PAYLOAD_MAX_BYTES",
        parse_positive_int,
        256 * 1024,
        "Largest payload of an agent-emitted event (JSON bytes).",
        group="api",
    )
    throttle_key_rate: str | None = setting(
        "CTXAPP_THROTTLE_KEY_RATE",
        parse_rate,
        "1200/min",
        "Requests per API key; more → 429 with Retry-After.",
        group="api",
    )
    throttle_address_rate: str | None = setting(
        "CTXAPP_THROTTLE_ADDRESS_RATE",
        parse_rate,
        "2400/min",
        "API requests per client address (all its keys together); more → 429 with Retry-After.",
        group="api",
    )
    throttle_auth_failure_rate: str | None = setting(
        "CTXAPP_THROTTLE_AUTH_FAILURE_RATE",
        parse_rate,
        "30/min",
        "Failed API authentications (401) per client address; past it every request from that address "
        "answers 429 until the window passes (guessing keys).",
        group="api",
    )
    mcp_streams_per_key: int = setting(
        "CTXAPP_MCP_STREAMS_PER_KEY",
        parse_positive_int,
        4,
        "Open `GET /mcp` event streams per API key (per server process); more → 429.",
        group="api",
    )
    mcp_streams_total: int = setting(
        "CTXAPP_MCP_STREAMS_TOTAL",
        parse_positive_int,
        100,
        "Open `GET /mcp` event streams of all keys together (per server process); more → 429.",
        group="api",
    )
    mcp_stream_idle_seconds: float = setting(
        "CTXAPP_MCP_STREAM_IDLE_SECONDS",
        parse_positive_float,
        300.0,
        "A `GET /mcp` event stream that sends no event (keep-alive pings do not count) for this long ends.",
        group="api",
    )
    num_proxies: int = setting(
        "CTXAPP_NUM_PROXIES",
        parse_int,
        0,
        "Reverse proxies in front of ctxapp that append to X-Forwarded-For; 0 = the socket's address is "
        "the client's (throttles and login lockouts count per client address).",
        group="api",
    )
    login_failure_limit: int = setting(
        "CTXAPP_LOGIN_FAILURE_LIMIT",
        parse_positive_int,
        5,
        "Failed admin or dashboard logins per username and address before that pair is locked out.",
        group="api",
    )
    login_cooloff_minutes: int = setting(
        "CTXAPP_LOGIN_COOLOFF_MINUTES",
        parse_positive_int,
        15,
        "How long a login lockout lasts.",
        group="api",
    )
    json_max_depth: int = setting(
        "CTXAPP_JSON_MAX_DEPTH",
        parse_positive_int,
        100,
        "Deepest nesting of objects and arrays accepted in a JSON body; deeper → 422.",
        group="api",
    )
    idempotency_ttl_hours: int = setting(
        "CTXAPP_IDEMPOTENCY_TTL_HOURS",
        parse_positive_int,
        24,
        "How long a stored Idempotency-Key response is replayed.",
        group="api",
    )
    page_size: int = setting(
        "CTXAPP_PAGE_SIZE",
        parse_positive_int,
        100,
        "Default page size of list endpoints.",
        group="api",
    )
    api_key_touch_seconds: int = setting(
        "CTXAPP_API_KEY_TOUCH_SECONDS",
        parse_positive_int,
        60,
        "An API key's last-used time is written at most this often.",
        group="api",
    )
    api_key_cache_seconds: float = setting(
        "CTXAPP_API_KEY_CACHE_SECONDS",
        parse_float,
        5.0,
        "How long a web process reuses an API-key lookup (0 = look it up on every request). "
        "Revocation, expiry and tenant changes on this host drop every process's cache at once; "
        "a web process on another host notices them within this time.",
        group="api",
    )
