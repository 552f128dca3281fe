"""The Celery app. Tasks live in memory/tasks/ (thin: ids in, one service call)."""

import logging
import os

import django
from celery import Celery
from celery.signals import after_setup_logger
from django.apps import apps

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")

app = Celery("ctxapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["memory"])


@app.on_after_finalize.connect
def _install_beat_schedule(sender: Celery, **kwargs: object) -> None:
    if not apps.ready:
        django.setup()
    from memory.tasks import BEAT_SCHEDULE  # lazy: django-setup

    sender.conf.beat_schedule = BEAT_SCHEDULE


class RoutineJobsFilter(logging.Filter):
    """Drops the INFO lines of the scheduled housekeeping jobs: beat's "Sending due task", the
    worker's "received" and "succeeded". They run every few seconds, so at INFO they would bury
    everything else (the one-time password and key `ctxapp up` prints scroll away). Their
    warnings and failures still show, and CTXAPP_LOG_LEVEL=debug shows everything."""

    def __init__(self, tasks: frozenset[str]) -> None:
        super().__init__()
        self.tasks = tasks

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        data = getattr(record, "data", None)  # celery passes a task's log context as extra["data"]
        if isinstance(data, dict) and data.get("name") in self.tasks:
            return False
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.name == "celery.beat" and len(args) == 2 and args[1] in self.tasks)


@after_setup_logger.connect
def _quiet_routine_jobs(logger: logging.Logger, loglevel: int | str | None = None, **kwargs: object) -> None:
    level = loglevel if isinstance(loglevel, int) else logging.getLevelName(str(loglevel).upper())
    if level == logging.DEBUG:
        return
    if not apps.ready:
        django.setup()
    from memory.tasks import BEAT_SCHEDULE  # lazy: django-setup

    routine = RoutineJobsFilter(frozenset(entry["task"] for entry in BEAT_SCHEDULE.values()))
    for handler in logger.handlers:
        handler.addFilter(routine)
