"""ctxapp.settings with a psycopg connection pool (Django 5.1+), for `bench_ingest.py --pool`.

Under ASGI every request runs its sync view in a fresh thread, so CONN_MAX_AGE > 0 keeps one
connection per (dead) thread until PostgreSQL refuses more ("too many clients"), and
CONN_MAX_AGE = 0 opens a connection per request. A pool per process avoids both.
"""

from ctxapp.settings import *  # noqa: F403
from ctxapp.settings import DATABASES

DATABASES["default"]["CONN_MAX_AGE"] = 0  # required with a pool
DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 2, "max_size": 20, "timeout": 10}
