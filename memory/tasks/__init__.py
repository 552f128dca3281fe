"""Celery tasks, one module per capability. Each task fetches by id and calls one service.

The beat schedule is assembled here from each module's SCHEDULE dict.
"""

from memory.tasks import cognition, context, decay, experiences, jobs, memory, otel, sessions

BEAT_SCHEDULE: dict = {}
for _module in (sessions, context, experiences, cognition, decay, jobs, memory, otel):
    BEAT_SCHEDULE.update(getattr(_module, "SCHEDULE", {}))
