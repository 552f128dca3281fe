"""GET /metrics in the Prometheus text format (prometheus-client).

Two kinds of series:

- measured in the process that served the request: request latency by route
  (`ctxapp_http_request_duration_seconds`). Several uvicorn workers are separate processes, so
  when PROMETHEUS_MULTIPROC_DIR is set (`ctxapp up` and `ctxapp web` set it under the data
  directory) every process writes its samples there and the scrape sums them;
- read from the database at scrape time, for everything the database already knows, so the
  answer is the same whichever process (web worker, Celery worker) did the work: context size and
  utilisation per build (BudgetSample rows), decay events and job outcomes (Event rows),
  retrieval hit rate (feedback ÷ results placed in contexts), embedding backlog and lag, and queue
  depth (asked of the broker, as the jobs page does).

Access: a bearer token (CTXAPP_METRICS_TOKEN) from anywhere, or no token from the networks in
CTXAPP_METRICS_ALLOW (default loopback only). Everything else answers 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from dashboard.jobs import queue_depths
from memory.models import BudgetSample, Event, Experience, ExperienceFeedback, Message

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTEXT_TOKEN_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1048576)
UTILISATION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)

# Background jobs and the events that record how each ended.
JOB_OUTCOME_EVENTS: dict[str, tuple[str, str]] = {
    "experience.embedded": ("experience_embed", "succeeded"),
    "experience.embedding_failed": ("experience_embed", "failed"),
    "experience.embedding_retried": ("experience_embed", "retried"),
    "memory.distilled": ("task_distill", "succeeded"),
    "summary.created": ("session_summarise", "succeeded"),
    "fact.decayed": ("decay_sweep", "succeeded"),
    "fact.promoted": ("facts_promote", "succeeded"),
    "retention.evicted": ("retention", "succeeded"),
    "session.expired": ("session_expire", "succeeded"),
}

# Request latency lives in the process; with PROMETHEUS_MULTIPROC_DIR set, prometheus-client
# backs it with files in that directory (chosen when prometheus_client is first imported).
_process_registry = CollectorRegistry()
REQUEST_LATENCY = Histogram(
    "ctxapp_http_request_duration_seconds",
    "Time to answer an HTTP request, by route name, method and status class.",
    ["route", "method", "status"],
    buckets=LATENCY_BUCKETS,
    registry=_process_registry,
)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class RequestMetricsMiddleware:
    """Observes every Django request's latency under its route name (never the raw path)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        start = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = (match.url_name or match.route or match.view_name) if match is not None else "unmatched"
        REQUEST_LATENCY.labels(
            route=route or "unnamed", method=request.method or "", status=f"{response.status_code // 100}xx"
        ).observe(time.perf_counter() - start)
        return response


async def observe_asgi(route: str, scope: Any, send: Any, app: Callable[[Any], Awaitable[None]]) -> None:
    """Run an ASGI app outside Django (the /mcp transport) and observe it like a Django route."""
    status = {"code": 500}

    async def timed_send(message: Any) -> None:
        if message["type"] == "http.response.start":
            status["code"] = message["status"]
        await send(message)

    start = time.perf_counter()
    try:
        await app(timed_send)
    finally:
        REQUEST_LATENCY.labels(
            route=route, method=scope.get("method", ""), status=f"{status['code'] // 100}xx"
        ).observe(time.perf_counter() - start)


def _histogram(
    name: str, doc: str, buckets: tuple[float, ...], counts: dict[str, Any], total: float
) -> HistogramMetricFamily:
    cumulative = [(_bucket_label(b), float(counts[f"le_{i}"] or 0)) for i, b in enumerate(buckets)]
    cumulative.append(("+Inf", float(counts["count"] or 0)))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=total)


def _bucket_label(value: float) -> str:
    return str(float(value))


class DatabaseCollector(Collector):
    """Series computed from the database (and the broker) when scraped."""

    def collect(self) -> Iterator[Metric]:
        yield from self._context_builds()
        yield from self._events()
        yield from self._retrieval()
        yield from self._embedding()
        yield from self._queues()

    def _context_builds(self) -> Iterator[Metric]:
        # Both histograms from one pass over the builds (an aggregate each read the table twice).
        buckets = {
            **{
                f"le_{i}": Count("id", filter=Q(prompt_tokens__lte=b))
                for i, b in enumerate(CONTEXT_TOKEN_BUCKETS)
            },
            **{
                f"utilisation_le_{i}": Count("id", filter=Q(utilisation__lte=b))
                for i, b in enumerate(UTILISATION_BUCKETS)
            },
        }
        row = BudgetSample.objects.aggregate(
            count=Count("id"), tokens_sum=Sum("prompt_tokens"), utilisation_sum=Sum("utilisation"), **buckets
        )
        yield _histogram(
            "ctxapp_context_build_tokens",
            "Prompt tokens of each context build.",
            CONTEXT_TOKEN_BUCKETS,
            row,
            float(row["tokens_sum"] or 0),
        )
        utilisation = {"count": row["count"]} | {
            f"le_{i}": row[f"utilisation_le_{i}"] for i in range(len(UTILISATION_BUCKETS))
        }
        yield _histogram(
            "ctxapp_context_build_utilisation",
            "Share of the model's input budget each context build used (0 to 1).",
            UTILISATION_BUCKETS,
            utilisation,
            float(row["utilisation_sum"] or 0),
        )

    def _events(self) -> Iterator[Metric]:
        counts = dict(
            # as the jobs page: `*.failed` / `*_failed` events are job failures, except the agents' own
            Event.objects.filter(Q(type__in=JOB_OUTCOME_EVENTS) | Q(type__endswith="failed"))
            .exclude(type__startswith="agent.")
            .values_list("type")
            .annotate(n=Count("id"))
            .values_list("type", "n")
        )
        decay = CounterMetricFamily(
            "ctxapp_decay_events", "Tracked facts that decayed (fact.decayed events)."
        )
        decay.add_metric([], float(counts.get("fact.decayed", 0)))
        yield decay
        jobs = CounterMetricFamily(
            "ctxapp_job_outcomes",
            "Background jobs by job and outcome (from their events).",
            labels=["job", "outcome"],
        )
        totals: dict[tuple[str, str], int] = {}
        for event_type, n in counts.items():
            key = JOB_OUTCOME_EVENTS.get(event_type) or (event_type.rsplit(".", 1)[0], "failed")
            totals[key] = totals.get(key, 0) + n
        for job, outcome in sorted({*totals, *JOB_OUTCOME_EVENTS.values()}):
            jobs.add_metric([job, outcome], float(totals.get((job, outcome), 0)))
        yield jobs

    def _retrieval(self) -> Iterator[Metric]:
        returned = int(BudgetSample.objects.aggregate(n=Sum("recalled_items"))["n"] or 0)
        feedback = ExperienceFeedback.objects.aggregate(
            used=Count("id", filter=Q(helpful=True)), unused=Count("id", filter=Q(helpful=False))
        )
        used = int(feedback["used"] or 0)
        family = CounterMetricFamily(
            "ctxapp_retrieval_results_returned",
            "Recalled items (memory search hits and experiences) placed in built contexts.",
        )
        family.add_metric([], float(returned))
        yield family
        family = CounterMetricFamily(
            "ctxapp_retrieval_feedback",
            "Feedback on retrieved memories, by whether it helped.",
            labels=["helpful"],
        )
        family.add_metric(["true"], float(used))
        family.add_metric(["false"], float(feedback["unused"] or 0))
        yield family
        rate = GaugeMetricFamily(
            "ctxapp_retrieval_hit_rate",
            "Retrieved memories reported helpful ÷ retrieved memories placed in contexts (0 when none).",
        )
        rate.add_metric([], used / returned if returned else 0.0)
        yield rate

    def _embedding(self) -> Iterator[Metric]:
        """Backlog and lag of each embedded kind: experiences, and messages (memory search's index;
        summaries and facts have no stored vector or status: they are embedded at query time)."""
        kinds: list[tuple[str, Any, str, tuple[str, ...]]] = [
            ("experience", Experience, _queue_for("memory.tasks.experiences.experiences_embed_task"),
             ("pending", "failed", "completed")),
            ("message", Message, _queue_for("memory.index.drain"),
             ("pending", "failed", "completed", "skipped")),
        ]  # fmt: skip
        backlog = GaugeMetricFamily(
            "ctxapp_embedding_backlog", "Rows by embedding status.", labels=["queue", "kind", "status"]
        )
        lag = GaugeMetricFamily(
            "ctxapp_embedding_lag_seconds",
            "Age of the oldest row still waiting for its embedding (0 when none waits).",
            labels=["queue", "kind"],
        )
        now = timezone.now()
        for kind, model, queue, statuses in kinds:
            rows = dict(
                model.objects.values_list("embedding_status")
                .annotate(n=Count("id"))
                .values_list("embedding_status", "n")
            )
            for status in statuses:
                backlog.add_metric([queue, kind, status], float(rows.get(status, 0)))
            oldest = model.objects.filter(embedding_status="pending").aggregate(t=Min("created_at"))["t"]
            lag.add_metric([queue, kind], (now - oldest).total_seconds() if oldest else 0.0)
        yield backlog
        yield lag

    def _queues(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "ctxapp_queue_depth", "Messages waiting in each broker queue.", labels=["queue"]
        )
        up = GaugeMetricFamily("ctxapp_broker_up", "1 when the broker answered the queue-depth question.")
        reachable = 1.0
        for queue in queue_depths():
            if queue.depth is None:
                reachable = 0.0
                continue
            depth.add_metric([queue.name], float(queue.depth))
        up.add_metric([], reachable)
        yield depth
        yield up


def _queue_for(task_name: str) -> str:
    routes = getattr(settings, "CELERY_TASK_ROUTES", None) or {}
    route = routes.get(task_name) if isinstance(routes, dict) else None
    if isinstance(route, dict) and route.get("queue"):
        return str(route["queue"])
    return str(settings.CELERY_TASK_DEFAULT_QUEUE)


def metrics_text() -> bytes:
    """The whole exposition: database series, then the processes' request latency."""
    database = CollectorRegistry()
    database.register(DatabaseCollector())
    directory = multiprocess_dir()
    if directory:
        processes = CollectorRegistry()
        multiprocess.MultiProcessCollector(processes, path=directory)
    else:
        processes = _process_registry
    return generate_latest(database) + generate_latest(processes)


def metrics_allowed(request: HttpRequest) -> bool:
    """A matching bearer token, or (without one) a client address inside CTXAPP_METRICS_ALLOW."""
    token = settings.CTXAPP.metrics_token
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), str(token).encode())
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    # The setting's parser already checked every network.
    return any(client in ipaddress.ip_network(n, strict=False) for n in settings.CTXAPP.metrics_allow)


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return JsonResponse(
            {
                "error": {
                    "code": "permission_denied",
                    "message": "Metrics are readable from CTXAPP_METRICS_ALLOW networks or with "
                    "'Authorization: Bearer <CTXAPP_METRICS_TOKEN>'.",
                    "details": {},
                }
            },
            status=403,
        )
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE)
