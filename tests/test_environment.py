"""The test run finds what it needs or says, once, how to set it up (tests/environment.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import environment


def test_a_missing_chromium_stops_the_run_with_the_command_to_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CTXAPP_CHROMIUM", raising=False)
    monkeypatch.setattr(environment, "DEFAULT_CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium on PATH either
    with pytest.raises(pytest.UsageError) as refused:
        environment.chromium_ensure(install=False)
    message = str(refused.value)
    assert "sudo scripts/test-setup" in message and "-m 'not browser'" in message


def test_a_chromium_named_by_the_environment_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "my-chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CTXAPP_CHROMIUM", str(fake))
    assert environment.chromium_ensure(install=False) == str(fake)


def test_the_suite_runs_on_its_own_redis_engine_from_the_wheel() -> None:
    """No system Redis is needed: the run's Redis is the embedded engine in its data directory."""
    from django.conf import settings

    from ctxapp.infra import embedded_redis

    assert embedded_redis.url(Path(settings.DATA_DIR)) == settings.REDIS_URL
    assert embedded_redis.ping(settings.REDIS_URL)
