"""Settings of the worker subprocesses in test_experiences_worker.py: the real settings, with a
short broker visibility timeout so a message left unacknowledged by a killed worker is
redelivered within seconds instead of an hour."""

from ctxapp.settings import *  # noqa: F403
from ctxapp.settings import CELERY_BROKER_TRANSPORT_OPTIONS

CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,
    "visibility_timeout": 3,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}
