"""An idle server does next to nothing: the periodic work that runs while nobody calls costs at
most one statement when there is nothing to do (docs/benchmarks.md, bench_cost.py: idle
statements per second), and `ctxapp up`'s watch for a stalled worker costs none."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ctxapp.cli import up
from memory.services import jobs
from memory.services.job_health import HEARTBEAT_KEY, heartbeat_record

pytestmark = pytest.mark.django_db


def test_the_job_sweep_of_an_idle_outbox_is_one_statement(django_assert_max_num_queries: Any) -> None:
    with django_assert_max_num_queries(1):
        assert jobs.jobs_sweep() == 0


def test_ups_stalled_worker_watch_reads_the_heartbeat_without_sql() -> None:
    with CaptureQueriesContext(connection) as queries:
        heartbeat_record()
        assert up._heartbeat()[0] is False
        cache.set(HEARTBEAT_KEY, time.time() - 61, timeout=None)  # past the 60 s deadline
        stalled, age, deadline = up._heartbeat()
    assert stalled and age > deadline == 60.0
    assert queries.captured_queries == []
    heartbeat_record()
