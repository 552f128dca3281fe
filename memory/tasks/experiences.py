"""Celery tasks of this capability."""

SCHEDULE: dict = {}
