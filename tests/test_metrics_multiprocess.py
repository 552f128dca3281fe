"""Request latency summed over uvicorn worker processes (prometheus-client multiprocess mode)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import worker_env
from tests.dashboard.live_server import free_port

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_web_workers_report_one_total(transactional_db: None, tmp_path: Path) -> None:
    port = free_port()
    env = {**worker_env(), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "ctxapp.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "2", "--lifespan", "off", "--log-level", "warning",
         "--no-access-log"],
        env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "the server did not start"
            time.sleep(0.2)
        for _ in range(30):  # new connections, spread over the workers by the kernel
            assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        text = httpx.get(f"{base}/metrics", timeout=30).text
    finally:
        proc.terminate()
        proc.wait(20)
    counts = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "ctxapp_http_request_duration_seconds_count"
    }
    # 31 answered by the time the scrape began (the readiness probe and the 30), whichever worker
    assert counts[(("method", "GET"), ("route", "healthz"), ("status", "2xx"))] == 31
    assert list(tmp_path.glob("histogram_*.db"))
