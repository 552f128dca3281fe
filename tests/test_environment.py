"""The test run finds what it needs or says, once, how to set it up (tests/environment.py)."""

from __future__ import annotations

import socket
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


def test_a_silent_local_redis_stops_the_run_with_the_command_to_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(environment, "_local_redis", lambda: ("127.0.0.1", port))
    with pytest.raises(pytest.UsageError) as refused:
        environment.redis_ensure(install=False)
    assert f"127.0.0.1:{port}" in str(refused.value) and "sudo scripts/test-setup" in str(refused.value)


def test_the_running_redis_lets_the_run_go_on() -> None:
    environment.redis_ensure(install=False)  # the suite's own Redis answers: no error
    address = environment._local_redis()
    assert address is None or environment._answers(address)
