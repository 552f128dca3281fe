"""The Celery app. Tasks live in memory/tasks/ (thin: ids in, one service call)."""

import os

import django
from celery import Celery
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
