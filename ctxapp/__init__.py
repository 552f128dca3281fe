"""ctxapp: context and memory service, and flight recorder, for LLM agents."""

from ctxapp.celery import app as celery_app

__all__ = ["celery_app"]
