"""Logging filters named in settings.LOGGING (imported while logging is configured, before the
apps are ready: no model imports here)."""

from __future__ import annotations

import logging


class ReadinessProbeLogFilter(logging.Filter):
    """Drops django.request's ERROR line for a 503 of /readyz: load balancers and `ctxapp up` poll
    it often, and ctxapp.health logs each change of state once instead. Reads the `request` and
    `status_code` Django documents on django.request's records."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        path = getattr(request, "path", None)
        return not (path in ("/readyz", "/readyz/") and getattr(record, "status_code", None) == 503)
