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
    """A console handler set up as a worker or beat sets up its own (the filter goes on the handlers
    of the logger celery configures), fed directly by celery's loggers: whatever other tests did to
    the logger tree (a worker set up in this process, Django's logging config) does not matter."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    configured = logging.Logger("console")  # stands in for the root logger celery configures
    configured.addHandler(handler)
    _quiet_routine_jobs(logger=configured, loglevel=level)
    loggers = [logging.getLogger(n) for n in ("celery.beat", trace.logger.name, strategy.logger.name)]
    saved = [(lg, lg.level, lg.disabled, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(level)
        lg.disabled, lg.propagate = False, False
    try:
        yield out
    finally:
        for lg, lvl, disabled, propagate in saved:
            lg.removeHandler(handler)
            lg.setLevel(lvl)
            lg.disabled, lg.propagate = disabled, propagate


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
