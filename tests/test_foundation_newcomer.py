"""The newcomer path stays consistent: the README's two commands, `.ci/run`, the compose stack."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/ctxapp up"
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest"


def test_the_readme_gives_the_run_and_test_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert RUN_COMMAND in readme
    assert TEST_COMMAND in readme
    # Every document the README links to exists.
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links to missing {target}"


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert lines[-1] == TEST_COMMAND
    assert lines[0] == "#!/usr/bin/env bash"


def test_the_console_script_is_declared() -> None:
    assert 'ctxapp = "ctxapp.cli:main"' in (REPO / "pyproject.toml").read_text()


def test_the_compose_stack_has_every_service_configured_by_environment() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"web", "worker", "beat", "postgres", "redis"} <= set(services)
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")
    # PostgreSQL's default 128 MB of buffers is far below what a whole-tenant search walks.
    assert "shared_buffers=${POSTGRES_SHARED_BUFFERS:-1GB}" in services["postgres"]["command"]
    for name in ("web", "worker", "beat"):
        env = services[name]["environment"]
        assert env["DATABASE_URL"].startswith("postgresql://")
        assert env["REDIS_URL"].startswith("redis://")
        assert "CTXAPP_SECRET_KEY" in env
    for name in ("web", "worker", "postgres", "redis"):
        assert "healthcheck" in services[name], name
    assert services["web"]["command"][:2] == ["ctxapp", "web"]
    assert services["worker"]["command"] == ["ctxapp", "worker"]
    assert services["beat"]["command"] == ["ctxapp", "beat"]
