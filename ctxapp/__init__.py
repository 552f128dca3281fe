"""ctxapp: context and memory service, and flight recorder, for LLM agents.

The Celery app is loaded lazily (`ctxapp.celery_app`, or `celery -A ctxapp`, which finds
`ctxapp.celery.app`), so `ctxapp.client` imports without Django or Celery. Each Django process's
entry point loads it (ctxapp/asgi.py, the worker and beat, ctxapp/cli/base.py `django_setup`), so
`shared_task`s bind to it there.
"""

from __future__ import annotations

from typing import Any

__all__ = ["celery_app"]


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from ctxapp.celery import app  # lazy: startup-cost

        return app
    raise AttributeError(f"module 'ctxapp' has no attribute {name!r}")
