"""`ctxapp eval recall` end to end: a live server, a real Celery worker, the real model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ctxapp.cli import evaluation, evaluation_data, evaluation_loo, main
from memory.models import Agent, Message, Session
from memory.services.tenancy import api_key_create

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SAMPLE = Path(__file__).parent / "data" / "recall_sample.locomo.json"


def eval_figures(
    server: Any, tenant: Any, capsys: pytest.CaptureFixture[str], path: Path, *extra: str
) -> Any:
    """`ctxapp eval recall PATH --json …` against the live server: its figures (the last stdout line)."""
    secret = api_key_create(tenant=tenant, name="eval")[1]
    code = main(["eval", "recall", str(path), "--url", server.url, "--api-key", secret, "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def test_the_harness_ingests_indexes_asks_and_reports_recall(
    live_server: Any, celery_worker: Any, tenant_a: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    figures, err = eval_figures(live_server, tenant_a, capsys, SAMPLE)
    assert {"questions", "R@1", "R@5", "R@10", "by_category", "ingest_s", "query_p50_ms", "query_p95_ms",
            "bm25"} <= set(figures)  # fmt: skip
    assert figures["questions"] == 10 and figures["questions_with_evidence"] == 9
    assert figures["R@10"] == 100.0 and figures["R@5"] >= 85.0 and figures["R@1"] >= 60.0
    assert set(figures["bm25"]) == {"R@5", "R@10"} and figures["bm25"]["R@10"] > 0
    assert figures["by_category"]["1"]["questions"] == 6 and figures["by_category"]["2"]["questions"] == 3
    assert figures["query_p95_ms"] >= figures["query_p50_ms"] > 0 and figures["ingest_s"] > 0
    # A context build in a new session of each user carries the evidence turns into the prompt.
    assert figures["evidence_in_prompt"] >= 85.0 and figures["kinds"] == ["message"]
    assert 0 < figures["recalled_tokens_median"] <= 1000 and figures["recalled_items_median"] >= 1
    assert "loo" not in figures
    assert "questions" in err  # the progress bar, on stderr
    # One ctxapp session per conversation session, each its own agent/user; speaker names and
    # session dates stored; everything embedded.
    sessions = Session.objects.filter(tenant=tenant_a)
    # ... and one new session per user for the context builds, with no message of its own.
    assert sessions.count() == 6 and sessions.values("user_id").distinct().count() == 2
    assert sessions.filter(messages__isnull=True).count() == 2
    first = Message.objects.get(session__in=sessions, content__startswith="Morning! I finally")
    assert first.name == "Ana" and first.occurred_at.isoformat() == "2023-05-08T13:56:00+00:00"
    assert set(Message.objects.filter(tenant=tenant_a).values_list("embedding_status", flat=True)) == {
        "completed"
    }


def test_a_run_faster_than_the_keys_rate_limit_waits_and_finishes(
    live_server: Any, celery_worker: Any, tenant_a: Any, capsys: pytest.CaptureFixture[str], settings: Any
) -> None:
    """The harness sends as fast as the server answers; over the per-key limit each request waits
    as the 429 says and goes on, and the figures are those of an unthrottled run."""
    import dataclasses

    from ctxapp.client._core import BACKOFF_MAX

    # Enough retries, each waiting at most BACKOFF_MAX, to outlast the default limit's 60 s window.
    assert evaluation.RATE_LIMIT_RETRIES * BACKOFF_MAX >= 60
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, throttle_key_rate="4/s")
    figures, _ = eval_figures(live_server, tenant_a, capsys, SAMPLE)
    assert figures["questions_with_evidence"] == 9 and figures["R@10"] == 100.0
    assert figures["evidence_in_prompt"] >= 85.0


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


def test_leave_one_conversation_out_and_other_kinds(
    live_server: Any, celery_worker: Any, tenant_a: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    figures, _ = eval_figures(
        live_server, tenant_a, capsys, SAMPLE, "--loo", "--kinds", "message,user_memory"
    )
    assert figures["kinds"] == ["message", "user_memory"]
    loo = figures["loo"]
    # Each conversation is scored with the settings chosen on the other one.
    assert [c["conversation"] for c in loo["chosen"]] == [0, 1]
    assert {"R@1", "R@5", "R@10", "evidence_in_prompt", "recalled_tokens_median"} <= set(loo)
    assert loo["R@10"] >= 85.0 and loo["evidence_in_prompt"] >= 70.0
    assert len(loo["in_sample"]["plans"]) == len(evaluation_loo.LOO_PLANS)
    assert len(loo["in_sample"]["recall"]) == len(evaluation_loo.LOO_RECALL)
    assert loo["in_sample"]["plans"][0]["R@10"] == figures["R@10"]  # the first setting: the defaults


def test_the_dev_sets_own_format_is_read(tmp_path: Path) -> None:
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps({"conversations": [{
        "id": "c1", "speakers": ["Ana", "Bot"],
        "sessions": [{"id": "c1s1", "date": "2025-01-12T20:15:00Z", "turns": [
            {"id": "c1s1t1", "speaker": "Ana", "text": "I moved to Lisbon."},
            {"id": "c1s1t2", "speaker": "Bot", "role": "assistant", "text": "Welcome to Lisbon!"},
        ]}],
        "questions": [{"question": "Where does Ana live?", "evidence": ["c1s1t1"], "category": "update"}],
    }]}))  # fmt: skip
    [conversation] = evaluation_data.load(str(dev))
    [(number, when, turns)] = conversation.sessions
    assert conversation.sample_id == "c1" and number == 1 and when is not None and when.year == 2025
    assert [evaluation_data.dia_key(t["dia_id"]) for t in turns] == ["c1s1t1", "c1s1t2"]
    assert evaluation_data.evidence_ids(conversation.questions[0]) == {"c1s1t1"}
    assert [evaluation.message_of(t, when)["role"] for t in turns] == ["user", "assistant"]
    dev.write_text(json.dumps({"conversations": [{"id": "c1", "sessions": [{"turns": "no"}]}]}))
    with pytest.raises(evaluation_data.HarnessError, match="has no 'turns' list"):
        evaluation_data.load(str(dev))


DEV_SET = Path(__file__).parent / "data" / "dev" / "conversations_dev.locomo.json"


@pytest.mark.quality
def test_quality_floor_evidence_in_the_prompt_of_a_new_session(
    live_server: Any, celery_worker: Any, tenant_a: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tenant's defaults, through the API, on the repository's dev set, beside the plain recipe
    # computed locally (--baseline). Measured 2026-12-03: R@5 63.8, R@10 77.5 (the recipe 54.4 /
    # 69.5); evidence in the prompt 85.3 % at a median 996 recalled tokens, `top_k` 20 under the
    # 1,000-token recall ceiling that each build keeps (docs/memory.md, "Through the API").
    figures, _ = eval_figures(live_server, tenant_a, capsys, DEV_SET, "--baseline")
    print(json.dumps(figures))  # the figures of record, in the test output
    assert figures["R@5"] >= 62.0 and figures["R@10"] >= 75.5, figures
    # Issue 35's target: evidence in the prompt >= R@10 at <= 1,000 recalled tokens (median).
    assert figures["evidence_in_prompt"] >= figures["R@10"], figures
    assert figures["recalled_tokens_median"] <= 1000, figures
    assert figures["R@5"] > figures["baseline"]["R@5"], figures  # ahead of the plain recipe


def test_the_baseline_is_the_plain_recipe_over_every_turn() -> None:
    # A stand-in embedder (every text alike) leaves BM25 to decide, over unstemmed words: the turn
    # that says "violin" wins, and the turn right after it is lifted by neighbour smoothing
    # above an unrelated turn of another session.
    import numpy as np

    from ctxapp.cli.evaluation_baseline import RecipeBaseline, baseline_turn

    class Flat:
        def embed(self, texts: list[str]) -> np.ndarray:
            return np.ones((len(texts), 4), dtype=np.float32) / 2

    turns = [
        baseline_turn(
            dia="D1:1", session="s1", position=1, speaker="Ana", text="I started the violin.", when=None
        ),
        baseline_turn(
            dia="D1:2", session="s1", position=2, speaker="Bo", text="Since when exactly?", when=None
        ),
        baseline_turn(dia="D2:1", session="s2", position=1, speaker="Ana", text="Work is busy.", when=None),
        baseline_turn(dia="D2:2", session="s2", position=2, speaker="Bo", text="Take a break.", when=None),
    ]
    ranked = RecipeBaseline(turns, embedder=Flat()).ranked("Which instrument did Ana start, the violin?")
    assert ranked[:2] == ["D1:1", "D1:2"]
