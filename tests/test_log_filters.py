"""A failing /readyz is logged once per change of state (ctxapp.health), not as an ERROR per poll."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils.log import log_response
from django.utils.module_loading import import_string


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_django_request_errors_of_the_readiness_probe_are_dropped_and_others_kept() -> None:
    config = settings.LOGGING
    assert "readiness_probe" in config["handlers"]["console"]["filters"]
    probe_filter = import_string(config["filters"]["readiness_probe"]["()"])()
    collect = Collect()
    logger = logging.getLogger("django.request")
    logger.addHandler(collect)
    saved = (logger.level, logger.disabled)
    logger.disabled = False  # another test's logging config may have switched it off
    logger.setLevel(logging.ERROR)
    try:
        for path in ("/readyz", "/api/v1/tenant"):
            log_response("Service Unavailable: %s", path, response=HttpResponse(status=503),
                         request=RequestFactory().get(path))  # fmt: skip
        log_response("Server Error: %s", "/readyz", response=HttpResponse(status=500),
                     request=RequestFactory().get("/readyz"))  # fmt: skip
    finally:
        logger.removeHandler(collect)
        logger.setLevel(saved[0])
        logger.disabled = saved[1]
    kept = [r.getMessage() for r in collect.records if probe_filter.filter(r)]
    assert kept == ["Service Unavailable: /api/v1/tenant", "Server Error: /readyz"]
