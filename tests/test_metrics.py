"""GET /metrics: Prometheus text with request latency by route and the database-derived series;
readable from the allowed networks or with the token, refused elsewhere."""

from __future__ import annotations

import dataclasses

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from ctxapp import metrics
from memory.models import BudgetSample, Event, Message, Tenant

pytestmark = pytest.mark.django_db


def scrape(**extra: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = Client().get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_scrape_after_api_calls_and_a_context_build(api_a: APIClient, tenant_a: Tenant) -> None:
    from memory.services import message_indexing

    before = scrape()
    earlier = api_a.post("/api/v1/sessions", {"agent": "bot", "user_id": "u1"}, format="json").json()["id"]
    for text in ("My puppy is called Biscuit.", "Biscuit the puppy loves the beach."):
        api_a.post(f"/api/v1/sessions/{earlier}/messages", {"role": "user", "content": text}, format="json")
    message_indexing.memory_index_drain()
    session = api_a.post("/api/v1/sessions", {"agent": "bot", "user_id": "u1"}, format="json").json()["id"]
    api_a.post(
        f"/api/v1/sessions/{session}/messages", {"role": "user", "content": "hello " * 50}, format="json"
    )
    built = api_a.post(
        f"/api/v1/sessions/{session}/context", {"input": "What is my puppy called?"}, format="json"
    ).json()
    api_a.get("/api/v1/sessions/ses_missing")
    experience = api_a.post("/api/v1/experiences", {"problem": "disk full"}, format="json").json()["id"]
    api_a.post(f"/api/v1/experiences/{experience}/feedback", {"helpful": True}, format="json")
    Event.objects.create(tenant=tenant_a, stream="bot", seq=999, type="fact.decayed", payload={})
    Event.objects.create(
        tenant=tenant_a, stream="bot", seq=1000, type="experience.embedding_failed", payload={}
    )

    after = scrape()
    assert_request_and_build_metrics(before, after, built, tenant_a)
    # Every recalled item the build placed in its prompt is counted, and only those.
    recalled = [i for i in built["manifest"]["items"] if i["kind"] in ("recall", "memory") and i["included"]]
    assert recalled and value(after, "ctxapp_retrieval_results_returned_total") == len(recalled)
    assert value(after, "ctxapp_retrieval_hit_rate") == pytest.approx(1 / len(recalled))
    assert_job_and_retrieval_metrics(after)


def assert_request_and_build_metrics(before: dict, after: dict, built: dict, tenant: Tenant) -> None:
    latency = "ctxapp_http_request_duration_seconds_count"
    route = {"route": "api-sessions", "method": "POST", "status": "2xx"}
    assert value(after, latency, **route) == value(before, latency, **route) + 2  # two sessions
    missing = {"route": "api-session", "method": "GET", "status": "4xx"}
    assert value(after, latency, **missing) == value(before, latency, **missing) + 1
    assert value(after, "ctxapp_http_request_duration_seconds_sum", **route) > 0

    tokens = built["budget"]["prompt_tokens"]
    assert value(after, "ctxapp_context_build_tokens_count") == 1
    assert value(after, "ctxapp_context_build_tokens_sum") == tokens
    smallest = next(b for b in metrics.CONTEXT_TOKEN_BUCKETS if tokens <= b)
    assert value(after, "ctxapp_context_build_tokens_bucket", le=str(float(smallest))) == 1
    assert value(after, "ctxapp_context_build_tokens_bucket", le="+Inf") == 1
    sample = BudgetSample.objects.get(tenant=tenant)
    assert value(after, "ctxapp_context_build_utilisation_sum") == pytest.approx(sample.utilisation)
    assert value(after, "ctxapp_context_build_utilisation_bucket", le="0.1") == (sample.utilisation <= 0.1)


def assert_job_and_retrieval_metrics(after: dict) -> None:
    assert value(after, "ctxapp_decay_events_total") == 1
    assert value(after, "ctxapp_job_outcomes_total", job="experience_embed", outcome="failed") == 1
    assert value(after, "ctxapp_job_outcomes_total", job="session_summarise", outcome="succeeded") == 0
    assert value(after, "ctxapp_retrieval_feedback_total", helpful="true") == 1
    queue = metrics._queue_for("memory.tasks.experiences.experiences_embed_task")
    assert value(after, "ctxapp_embedding_backlog", queue=queue, kind="experience", status="pending") == 1
    assert value(after, "ctxapp_embedding_lag_seconds", queue=queue, kind="experience") > 0
    assert ("ctxapp_queue_depth", (("queue", queue),)) in after
    # the message appended above waits for memory search's embedding drain (no worker here)
    drain = metrics._queue_for("memory.index.drain")
    assert value(after, "ctxapp_embedding_backlog", queue=drain, kind="message", status="pending") == 1
    assert value(after, "ctxapp_embedding_lag_seconds", queue=drain, kind="message") > 0
    Message.objects.update(embedding_status="completed")
    drained = scrape()
    assert value(drained, "ctxapp_embedding_backlog", queue=drain, kind="message", status="pending") == 0
    assert value(drained, "ctxapp_embedding_backlog", queue=drain, kind="message", status="completed") == 3
    assert value(drained, "ctxapp_embedding_lag_seconds", queue=drain, kind="message") == 0
    assert value(after, "ctxapp_broker_up") == 1


def test_outside_the_allow_list_is_refused(settings: object) -> None:
    response = Client().get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert Client().get("/metrics", REMOTE_ADDR="::1").status_code == 200


def test_the_token_opens_it_from_anywhere_and_a_wrong_one_does_not(settings: object) -> None:
    settings.CTXAPP = dataclasses.replace(  # type: ignore[attr-defined]
        settings.CTXAPP,  # type: ignore[attr-defined]
        metrics_token="s3cret-metrics-token",
        metrics_allow=[],
    )
    client = Client()
    assert client.get("/metrics").status_code == 403  # loopback no longer allowed
    good = client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert good.status_code == 200 and b"ctxapp_context_build_tokens" in good.content
    bad = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer nope")
    assert bad.status_code == 403


def test_the_grafana_dashboard_charts_exactly_the_series_we_export(api_a: APIClient) -> None:
    import json
    import re
    from pathlib import Path

    api_a.get("/api/v1/sessions")  # a request, so the latency series has a sample
    dashboard = json.loads((Path(__file__).parent.parent / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {re.sub(r"_(bucket|count|sum|total)$", "", m) for e in exprs for m in re.findall(r"ctxapp_\w+", e)}
    exported = {re.sub(r"_(bucket|count|sum|total|created)$", "", name) for name, _ in scrape()}
    assert used and used <= exported, used - exported
    ours = {name for name in exported if name.startswith("ctxapp_")}
    assert ours <= used, f"exported but charted nowhere: {sorted(ours - used)}"


def test_a_bad_network_in_the_allow_list_is_refused_at_start() -> None:
    from ctxapp.conf import SettingError, resolve_all

    with pytest.raises(SettingError, match="CTXAPP_METRICS_ALLOW"):
        resolve_all({"CTXAPP_METRICS_ALLOW": "10.0.0.0/8,not-a-network"})
    assert resolve_all({"CTXAPP_METRICS_ALLOW": "10.0.0.0/8, 192.168.1.7"})["CTXAPP_METRICS_ALLOW"].value == [
        "10.0.0.0/8",
        "192.168.1.7",
    ]
