"""Rolling summaries: the offline summariser, the optional endpoint with its fallback, the job."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings as django_settings

from memory.models import BudgetSample, Event, ModelProfile, Summary, SummaryMethod
from memory.services import broadcast, decay
from memory.services import rolling_summary as summarise
from memory.services.context import context_build
from memory.services.rolling_summary import offline_summary, session_summarise
from memory.services.sessions import MessageInput, messages_append, session_create
from memory.tasks.context import session_summarise as summarise_task


def _rows(*texts: str, role: str = "user") -> list[dict]:
    return [
        {"seq": n + 1, "role": role, "content": t, "tool_calls": [], "tool_call_id": "", "metadata": {}}
        for n, t in enumerate(texts)
    ]


def test_offline_summary_keeps_decisions_errors_constraints_numbers_and_names():
    rows = _rows(
        "hello there, how are you today?",
        "We decided to move the orders table to PostgreSQL 16.",
        "The import failed with error E1234: connection refused on port 5432.",
        "The report must never include customer emails.",
        "nice weather",
        "Alice from the Berlin office owns the migration; budget is 4,000 EUR.",
    )
    text = offline_summary(previous="", rows=rows, max_tokens=400)
    assert "Decisions:\n- [#2 user] We decided to move the orders table to PostgreSQL 16." in text
    assert "Errors:\n- [#3 user] The import failed with error E1234" in text
    assert "Constraints:\n- [#4 user] The report must never include customer emails." in text
    assert "4,000 EUR" in text and "Alice" in text
    # a tight budget keeps the most important first
    tight = offline_summary(previous="", rows=rows, max_tokens=30)
    assert "decided" in tight and "nice weather" not in tight
    # the previous summary's lines are carried forward
    again = offline_summary(previous=text, rows=_rows("ok then"), max_tokens=400)
    assert "[#2 user] We decided to move the orders table" in again


def _session_with_history(tenant, n: int, model: str = "gpt-4o"):
    session = session_create(tenant=tenant, agent_external_id="bot", model_name=model)
    items = []
    for i in range(n):
        items.append(
            MessageInput(role="user", content=f"Step {i}: we decided to use option {i} for the parser. " * 3)
        )
        items.append(MessageInput(role="assistant", content=f"Done with step {i}; the error rate is {i}%."))
    messages_append(tenant=tenant, session=session, items=items)
    return session


@pytest.mark.django_db
def test_it_folds_all_but_the_tail_once_and_records_the_event(tenant_a, monkeypatch):
    seen = {}
    monkeypatch.setattr(
        decay, "facts_after_summary", lambda **kw: seen.setdefault("kw", kw) and ["lost: budget"]
    )
    session = _session_with_history(tenant_a, 10)  # 20 messages
    summary = session_summarise(tenant=tenant_a, session=session)
    assert summary is not None and summary.is_current
    assert (summary.folded_from_seq, summary.folded_to_seq, summary.folded_count) == (1, 15, 15)
    assert summary.covers_up_to_seq == 15
    assert summary.tokens_after < summary.tokens_before
    assert summary.method == SummaryMethod.OFFLINE
    event = Event.objects.get(type="summary.created")
    assert event.payload["summary_id"] == summary.public_id
    assert event.payload["tokens_before"] == summary.tokens_before
    assert event.payload["alerts"] == ["lost: budget"]
    assert seen["kw"]["folded_seqs"] == list(range(1, 16))
    # idempotent: running again folds nothing
    assert session_summarise(tenant=tenant_a, session=session) is None
    assert Summary.objects.count() == 1 and Event.objects.filter(type="summary.created").count() == 1
    # new messages → a new current summary, the old one kept as history
    messages_append(tenant=tenant_a, session=session, items=[MessageInput(role="user", content="more")] * 3)
    second = session_summarise(tenant=tenant_a, session=session)
    assert second.previous_id == summary.pk and second.folded_from_seq == 16 and second.covers_up_to_seq == 18
    summary.refresh_from_db()
    assert not summary.is_current and Summary.objects.filter(is_current=True).get() == second


@pytest.mark.django_db
def test_a_long_backlog_is_folded_in_bounded_chunks(
    tenant_a, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(summarise, "MAX_FOLD_PER_JOB", 6)
    session = _session_with_history(tenant_a, 10)  # 20 messages, the tail starts after seq 15
    covered = []
    from memory.models import JobIntent

    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=False):
            summary = session_summarise(tenant=tenant_a, session=session)
        follow_up = JobIntent.objects.filter(kind="session.summarise", status="pending")
        covered.append((summary.folded_from_seq, summary.covers_up_to_seq, follow_up.count()))
        follow_up.update(status="done")  # as if a worker ran it
    assert covered == [(1, 6, 1), (7, 12, 1), (13, 15, 0)]  # the last chunk queues no follow-up
    assert Summary.objects.filter(session=session, is_current=True).get().covers_up_to_seq == 15
    assert Event.objects.filter(type="summary.created").count() == 3


@pytest.mark.django_db
def test_fold_boundary_never_splits_a_tool_call_from_its_results(tenant_a):
    session = session_create(tenant=tenant_a, agent_external_id="bot", model_name="gpt-4o")
    call = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[
            MessageInput(role="user", content="find it"),  # 1
            MessageInput(role="user", content="please"),  # 2
            MessageInput(role="assistant", content="", tool_calls=[call]),  # 3
            MessageInput(
                role="tool", content="found in a.py", tool_call_id="c1"
            ),  # 4  ← tail starts at 4 (keep 5 of 8)
            MessageInput(role="assistant", content="It is in a.py"),  # 5
            MessageInput(role="user", content="thanks"),  # 6
            MessageInput(role="user", content="next"),  # 7
            MessageInput(role="user", content="go"),  # 8
        ],
    )
    summary = session_summarise(tenant=tenant_a, session=session)
    assert summary.covers_up_to_seq == 2  # seq 3 (the call) stays with its result in the tail
    built = context_build(tenant=tenant_a, session=session, next_input="now")
    history = [m for m in built.messages if m["role"] in {"assistant", "tool"}]
    assert history[0]["tool_calls"][0]["id"] == "c1" and history[1]["tool_call_id"] == "c1"


def _small_model_for(tenant, session) -> int:
    """A model whose window puts this session's next prompt at ~90 % (over the threshold, within budget)."""
    probe = context_build(tenant=tenant, session=session, next_input="what next?", model_name="gpt-4o")
    BudgetSample.objects.filter(public_id=probe.build_id).delete()
    limit = int(probe.budget["demand_tokens"] / 0.9)
    ModelProfile.objects.create(
        tenant=tenant, name="small", input_limit=limit, output_limit=20, tokenizer="o200k_base"
    )
    return limit


@pytest.mark.django_db
def test_summarisation_triggers_at_threshold_and_next_build_is_smaller(tenant_a):
    session = _session_with_history(tenant_a, 12, model="small")
    limit = _small_model_for(tenant_a, session)
    first = context_build(tenant=tenant_a, session=session, next_input="what next?")
    assert first.budget["demand_tokens"] >= first.budget["threshold_tokens"] == int(0.85 * limit)
    assert (
        first.budget["prompt_tokens"] == first.budget["demand_tokens"]
    )  # it fits: the threshold alone triggers
    assert first.summarisation.queued is True
    assert BudgetSample.objects.get(public_id=first.build_id).summarisation_queued
    summarise_task(session.pk)  # the job the build queued, run here; the real queue is proven below
    summary = Summary.objects.get(session=session, is_current=True)
    assert Event.objects.filter(type="summary.created").count() == 1
    second = context_build(tenant=tenant_a, session=session, next_input="what next?")
    assert second.budget["prompt_tokens"] < first.budget["prompt_tokens"]
    assert second.budget["components"]["summary"] > 0
    assert second.budget["components"]["history"] < first.budget["components"]["history"]
    assert [i["seq"] for i in second.manifest["items"] if i["kind"] == "history"] == list(
        range(summary.covers_up_to_seq + 1, 25)
    )
    assert second.summarisation.queued is False


@pytest.mark.django_db
def test_a_burst_of_builds_over_the_threshold_queues_one_job(tenant_a, django_capture_on_commit_callbacks):
    session = _session_with_history(tenant_a, 12, model="small")
    _small_model_for(tenant_a, session)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        first = context_build(tenant=tenant_a, session=session, next_input="what next?")
        second = context_build(tenant=tenant_a, session=session, next_input="and now?")
    assert first.summarisation.queued is True and first.summarisation.already_queued is False
    assert second.summarisation.queued is False and second.summarisation.already_queued is True
    assert len([c for c in callbacks if not broadcast.is_live_update(c)]) == 1  # live updates aside
    assert list(
        BudgetSample.objects.order_by("created_at").values_list("summarisation_queued", flat=True)
    ) == [
        True,
        False,
    ]


@pytest.mark.django_db(transaction=True)
def test_build_queues_summarisation_on_the_real_worker(tenant_a, celery_worker):
    session = _session_with_history(tenant_a, 12, model="small")
    _small_model_for(tenant_a, session)
    built = context_build(tenant=tenant_a, session=session, next_input="what next?")
    assert built.summarisation.queued is True
    deadline = time.monotonic() + 60
    while not Summary.objects.filter(session=session).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    summary = Summary.objects.get(session=session)
    assert summary.covers_up_to_seq == 24 - 5
    assert Event.objects.filter(type="summary.created", session=session).exists()


# --- the optional endpoint ------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"
    requests: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
        )
        if self.mode == "slow":
            time.sleep(1.5)
        if self.mode == "garbage":
            payload = b"<html>definitely not json"
        elif self.mode == "empty":
            payload = json.dumps({"choices": [{"message": {"content": ""}}]}).encode()
        else:
            payload = json.dumps(
                {"choices": [{"message": {"content": "LLM SUMMARY: decided option 9."}}]}
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # the client timed out and left
            self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def llm_server(monkeypatch) -> Iterator[type[_Handler]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.requests = []
    conf = dataclasses.replace(
        django_settings.CTXAPP,
        summariser_url=f"http://127.0.0.1:{server.server_port}/v1",
        summariser_model="tiny-llm",
        summariser_api_key="sk-test",
        summariser_timeout=0.5,
        summariser_retries=1,
    )
    monkeypatch.setattr(django_settings, "CTXAPP", conf)
    yield _Handler
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_endpoint_writes_the_summary_when_it_answers(tenant_a, llm_server):
    llm_server.mode = "ok"
    session = _session_with_history(tenant_a, 5)
    summary = session_summarise(tenant=tenant_a, session=session)
    assert summary.method == SummaryMethod.LLM and summary.text == "LLM SUMMARY: decided option 9."
    request = llm_server.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert request["body"]["model"] == "tiny-llm" and "[#1 user]" in request["body"]["messages"][1]["content"]


@pytest.mark.django_db
@pytest.mark.parametrize("mode", ["garbage", "empty", "slow"])
def test_endpoint_failure_falls_back_to_offline(tenant_a, llm_server, mode):
    llm_server.mode = mode
    session = _session_with_history(tenant_a, 5)
    summary = session_summarise(tenant=tenant_a, session=session)
    assert summary.method == SummaryMethod.LLM_FALLBACK
    assert summary.error
    assert "Decisions:" in summary.text  # the offline summariser wrote it
    assert len(llm_server.requests) == 2  # one try + one retry
    assert Event.objects.get(type="summary.created").payload["method"] == "llm_fallback"
