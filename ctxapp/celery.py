"""The Celery app. Tasks live in memory/tasks/ (thin: ids in, one service call)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")

app = Celery("ctxapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["memory"])


@app.on_after_finalize.connect
def _install_beat_schedule(sender: Celery, **kwargs: object) -> None:
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()
    from memory.tasks import BEAT_SCHEDULE

    sender.conf.beat_schedule = BEAT_SCHEDULE
