"""Celery tasks of OpenTelemetry ingest (memory/services/otel_ingest). Thin: one service call."""

from __future__ import annotations

from celery import shared_task

from memory.services.otel_ingest import held_spans_flush
from memory.services.otel_ingest.holding import HOLD_SECONDS


@shared_task(acks_late=True, name="memory.otel.held_flush")
def otel_held_flush_task() -> int:
    """Record held spans whose trace's root never came within the hold (a sender gone quiet)."""
    return held_spans_flush()


SCHEDULE: dict = {
    "otel-held-flush": {"task": "memory.otel.held_flush", "schedule": HOLD_SECONDS / 4},
}
