"""`ctxapp demo` against a real server: every step runs, and the data every panel shows exists."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from ctxapp.cli import demo
from memory.models import BudgetSample, Checkpoint, Event, Experience, Message, Session, Tenant, TrackedFact
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env
from tests.dashboard.live_server import uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo_tenant(transactional_db: None) -> tuple[Tenant, str]:
    tenant = Tenant.objects.create(name="Demo", slug="demo")
    _, secret = api_key_create(tenant=tenant, name="demo")
    return tenant, secret


@pytest.fixture
def server(demo_tenant: tuple[Tenant, str]) -> Iterator[str]:
    with uvicorn_server(worker_env()) as base:
        yield base


def test_the_demo_drives_every_capability(
    server: str, demo_tenant: tuple[Tenant, str], capsys: pytest.CaptureFixture
) -> None:
    tenant, key = demo_tenant
    assert demo.main(SimpleNamespace(url=server, api_key=key, pace=0)) == 0
    out = capsys.readouterr().out
    assert "0 skipped" in out, out
    sessions = Session.objects.filter(tenant=tenant)
    assert sessions.count() == 3  # the incident, the resumed session, db-doctor's
    assert Message.objects.filter(tenant=tenant).count() > 60
    assert BudgetSample.objects.filter(tenant=tenant).count() >= len(demo.INCIDENT_TURNS)
    assert max(s.utilisation for s in BudgetSample.objects.filter(tenant=tenant)) >= 0.85  # crosses the line
    assert TrackedFact.objects.filter(tenant=tenant).count() >= 7
    assert Checkpoint.objects.filter(tenant=tenant).count() >= 5
    assert Experience.objects.filter(tenant=tenant).count() >= 3
    types = set(Event.objects.filter(tenant=tenant).values_list("type", flat=True))
    assert {
        "agent.crashed",
        "agent.recovered",
        "task.completed",
        "context.built",
        "checkpoint.created",
    } <= types


def test_the_demo_explains_a_missing_key_and_a_refused_one(
    server: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CTXAPP_API_KEY", raising=False)
    assert demo.main(SimpleNamespace(url=server, api_key="", pace=0)) == 2
    assert "needs an API key" in capsys.readouterr().err
    assert demo.main(SimpleNamespace(url=server, api_key="ctx_nope_nope", pace=0)) == 2
    assert "refused" in capsys.readouterr().err


def test_a_step_whose_capability_is_missing_is_skipped_with_a_note() -> None:
    from ctxapp.client import NotFound, ServerError

    lines: list[str] = []
    run = demo.Demo(client=None, pace=0, out=lines.append)
    with run.step("experiences"):
        raise NotFound("No endpoint at /api/v1/experiences.", code="not_found", status=404)
    with run.step("context build"):
        raise ServerError("boom", code="internal_error", status=500)
    with run.step("checkpoint"):
        pass
    assert run.skipped == ["experiences", "context build"] and run.done == ["checkpoint"]
    assert (
        lines[0]
        == "  - skipped experiences: not available on this server yet (No endpoint at /api/v1/experiences.)"
    )
    assert lines[1].startswith("  - skipped context build: internal_error")
