"""Embedding experiences a batch at a time: one job, one model call, bulk writes,
and the same merges and supersedes as if the rows had been embedded one by one. Real PostgreSQL +
pgvector and the real local MiniLM model."""

from __future__ import annotations

import pytest
from django.db import transaction

from memory.models import Event, Experience, JobIntent
from memory.services import jobs
from memory.services.experiences import experience_create, experiences_embed
from memory.services.experiences.bulk import experiences_create_bulk
from memory.services.experiences.records import BulkItem
from memory.tasks.jobs import job_run_task

pytestmark = pytest.mark.django_db

CRASH = "Pod stuck in CrashLoopBackOff after deploy"
CONFIGMAP = (
    "The DATABASE_URL environment variable was missing from the ConfigMap; added it and rolled out again"
)
# In this order: the original, a near-identical rewording (merges into it), a contradicting fix of
# the same problem (supersedes it), and an unrelated one (touches nothing).
TEXTS = [
    (CRASH, CONFIGMAP),
    (CRASH, CONFIGMAP.replace("environment", "env")),
    (CRASH, "The liveness probe timeout was too short; raised initialDelaySeconds to 30"),
    ("Nginx returns 502 Bad Gateway", "bind the upstream to 0.0.0.0"),
]


def _write(tenant):
    return [
        experience_create(tenant=tenant, problem=p, solution=s, confidence=0.6).experience for p, s in TEXTS
    ]


def _outcome(tenant, rows):
    """What a reader sees: each row's merge / supersede target (as an index into rows), and the
    merge and supersede events in order."""
    index = {row.pk: position for position, row in enumerate(rows)}
    states = []
    for row in rows:
        row.refresh_from_db()
        assert row.embedding_status == "completed" and row.embedding_attempts == 1
        states.append((index.get(row.merged_into_id), index.get(row.superseded_by_id), row.merge_count))
    kinds = list(
        Event.objects.filter(tenant=tenant, type__in=["experience.merged", "experience.superseded"])
        .order_by("pk")
        .values_list("type", flat=True)
    )
    return states, kinds


def test_a_batch_merges_and_supersedes_exactly_as_one_by_one(tenant_a, tenant_b):
    one_by_one = _write(tenant_a)
    for row in one_by_one:
        assert experiences_embed(experience_ids=[row.pk]) == 1
    batch = _write(tenant_b)
    assert experiences_embed(experience_ids=[row.pk for row in batch]) == len(batch)

    expected = _outcome(tenant_a, one_by_one)
    assert _outcome(tenant_b, batch) == expected
    # The rewording merged into the original, then the contradiction superseded the original.
    assert expected == ([(None, 2, 1), (0, None, 0), (None, None, 0), (None, None, 0)],
                        ["experience.merged", "experience.superseded"])  # fmt: skip


def test_a_bulk_create_is_embedded_by_one_job_run_once_with_one_event_per_row(tenant_a):
    items = [
        BulkItem(problem=f"Service {name} fails its health check", solution=f"restart the {name} sidecar")
        for name in ("billing", "search", "auth", "mailer", "ingest", "thumbnails", "reports", "cron")
    ] + [BulkItem(problem=problem, solution=solution) for problem, solution in TEXTS[2:]]
    with transaction.atomic():
        experiences_create_bulk(tenant=tenant_a, items=items)
    [intent] = JobIntent.objects.filter(kind=jobs.EMBED)
    assert job_run_task(intent.pk) == "done"
    assert job_run_task(intent.pk) == "skipped"  # a redelivery writes nothing twice
    rows = Experience.objects.filter(tenant=tenant_a)
    assert rows.count() == len(items)
    assert set(rows.values_list("embedding_status", "embedding_attempts")) == {("completed", 1)}
    assert all(len(row.problem_embedding) == 384 and len(row.embedding) == 384 for row in rows)
    embedded = Event.objects.filter(tenant=tenant_a, type="experience.embedded")
    expected = sorted(rows.values_list("public_id", flat=True))
    assert sorted(e.payload["experience"] for e in embedded) == expected
    assert {e.payload["dimensions"] for e in embedded} == {384}
