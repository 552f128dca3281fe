"""The console of `ctxapp up` is not buried under the scheduled housekeeping jobs' INFO lines."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from celery.app import trace
from celery.worker import strategy

from ctxapp.celery import RoutineJobsFilter, _quiet_routine_jobs
from memory.tasks import BEAT_SCHEDULE


@contextmanager
def _console(level: int) -> Iterator[io.StringIO]:
    """A console handler on celery's loggers, set up as a worker or beat sets up its own."""
    out = io.StringIO()
    celery_logger = logging.getLogger("celery")
    handler = logging.StreamHandler(out)
    celery_logger.addHandler(handler)
    previous = celery_logger.level
    celery_logger.setLevel(level)
    try:
        _quiet_routine_jobs(logger=celery_logger, loglevel=level)
        yield out
    finally:
        celery_logger.removeHandler(handler)
        celery_logger.setLevel(previous)


def _log_as_celery(task: str) -> None:
    """The three lines a scheduled task costs, through celery's own loggers and formats."""
    logging.getLogger("celery.beat").info("Scheduler: Sending due task %s (%s)", "entry", task)
    context = {"name": task, "id": "abc", "runtime": 0.01, "return_value": None}
    strategy.logger.info(trace.LOG_RECEIVED, context, extra={"data": context})
    trace.logger.info(trace.LOG_SUCCESS, context, extra={"data": context})


def test_scheduled_jobs_log_nothing_at_info_but_their_failures() -> None:
    routine = next(iter(BEAT_SCHEDULE.values()))["task"]
    with _console(logging.INFO) as out:
        _log_as_celery(routine)
        assert out.getvalue() == ""
        failed = {"name": routine, "id": "x"}
        trace.logger.error("Task %(name)s[%(id)s] raised", failed, extra={"data": failed})
        assert "raised" in out.getvalue()
        # Other jobs (a message's embedding, a digest) still say that they ran.
        _log_as_celery("memory.tasks.sessions.session_digest_task")
        assert "received" in out.getvalue() and "succeeded" in out.getvalue()


def test_debug_shows_every_line() -> None:
    routine = next(iter(BEAT_SCHEDULE.values()))["task"]
    with _console(logging.DEBUG) as out:
        _log_as_celery(routine)
        assert out.getvalue().count(routine) == 3
    assert RoutineJobsFilter(frozenset()).filter(logging.makeLogRecord({"levelno": logging.INFO}))
