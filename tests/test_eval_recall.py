"""`ctxapp eval recall` end to end: a live server, a real Celery worker, the real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxapp.cli import main
from memory.models import Agent, Message, Session
from memory.services.tenancy import api_key_create

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SAMPLE = Path(__file__).parent / "data" / "recall_sample.locomo.json"


def test_the_harness_ingests_indexes_asks_and_reports_recall(
    live_server: Any, celery_worker: Any, tenant_a: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = api_key_create(tenant=tenant_a, name="eval")[1]
    code = main(["eval", "recall", str(SAMPLE), "--url", live_server.url, "--api-key", secret, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    figures = json.loads(captured.out.strip().splitlines()[-1])
    assert {"questions", "R@1", "R@5", "R@10", "by_category", "ingest_s", "query_p50_ms", "query_p95_ms",
            "bm25"} <= set(figures)  # fmt: skip
    assert figures["questions"] == 10 and figures["questions_with_evidence"] == 9
    assert figures["R@10"] == 100.0 and figures["R@5"] >= 85.0 and figures["R@1"] >= 60.0
    assert set(figures["bm25"]) == {"R@5", "R@10"} and figures["bm25"]["R@10"] > 0
    assert figures["by_category"]["1"]["questions"] == 6 and figures["by_category"]["2"]["questions"] == 3
    assert figures["query_p95_ms"] >= figures["query_p50_ms"] > 0 and figures["ingest_s"] > 0
    assert "questions" in captured.err  # the progress bar, on stderr
    # One ctxapp session per conversation session, each its own agent/user; speaker names and
    # session dates stored; everything embedded.
    sessions = Session.objects.filter(tenant=tenant_a)
    assert sessions.count() == 4 and sessions.values("user_id").distinct().count() == 2
    first = Message.objects.get(session__in=sessions, content__startswith="Morning! I finally")
    assert first.name == "Ana" and first.occurred_at.isoformat() == "2023-05-08T13:56:00+00:00"
    assert set(Message.objects.filter(tenant=tenant_a).values_list("embedding_status", flat=True)) == {
        "completed"
    }


def test_cleanup_deletes_what_it_created(
    live_server: Any, celery_worker: Any, tenant_a: Any, capsys: Any
) -> None:
    secret = api_key_create(tenant=tenant_a, name="eval")[1]
    code = main(["eval", "recall", str(SAMPLE), "--url", live_server.url, "--api-key", secret, "--cleanup"])
    out = capsys.readouterr().out
    assert code == 0 and "R@10 100.0" in out
    assert not Session.objects.filter(tenant=tenant_a).exists()
    assert not Message.objects.filter(tenant=tenant_a).exists()
    assert Agent.objects.filter(tenant=tenant_a).count() == 2  # agents stay (no delete endpoint)


def test_a_bad_file_is_a_clear_error(tmp_path: Path, capsys: Any) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a list"}')
    assert main(["eval", "recall", str(bad), "--api-key", "ctx_x_y"]) == 1
    assert "expected a JSON list of samples" in capsys.readouterr().err
