"""Re-embedding experiences here and now (a model change, failed rows), with progress events."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from memory.models import EmbeddingStatus, Experience, Tenant
from memory.services import recorder
from memory.services.embedding import EmbedderError
from memory.services.experiences.embed import experiences_embed, experiences_mark_failed


@dataclass(frozen=True)
class ReembedResult:
    job: str
    total: int
    completed: int
    failed: int


# A long re-embed reports its progress at most this often per tenant (plus at start and end).
REEMBED_PROGRESS_EVERY_SECONDS = 2.0


def experiences_reembed(
    *,
    only_failed: bool = False,
    tenant: Tenant | None = None,
    batch_size: int | None = None,
    on_start: Callable[[int], None] | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> ReembedResult:
    """Re-embed all (or only failed) experiences, of `tenant` or all, in batches, here and now.

    Each tenant concerned gets `experience.reembed.progress` events (`job`, `done`, `total`,
    `failed`) at the start, at most every REEMBED_PROGRESS_EVERY_SECONDS and at the end: the
    dashboard's jobs panel shows them as a progress bar. `on_start(total)` is told how many there
    are, then `on_batch(n)` of each batch of n.
    """
    queryset = Experience.objects.all()
    if tenant is not None:
        queryset = queryset.filter(tenant=tenant)
    if only_failed:
        queryset = queryset.filter(embedding_status=EmbeddingStatus.FAILED)
    rows = list(queryset.order_by("pk").values_list("pk", "tenant_id"))
    size = batch_size or settings.CTXAPP.embedding_batch_size
    job = f"reembed-{secrets.token_hex(4)}"
    tenants = {t.pk: t for t in Tenant.objects.filter(pk__in={tenant_id for _, tenant_id in rows})}
    totals: dict[int, int] = {}
    for _, tenant_id in rows:
        totals[tenant_id] = totals.get(tenant_id, 0) + 1
    done = dict.fromkeys(totals, 0)
    lost = dict.fromkeys(totals, 0)
    reported: dict[int, float] = {}

    def report(tenant_id: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - reported.get(tenant_id, 0.0) < REEMBED_PROGRESS_EVERY_SECONDS:
            return
        reported[tenant_id] = now
        recorder.event_append(
            tenant=tenants[tenant_id],
            type="experience.reembed.progress",
            payload={
                "job": job,
                "done": done[tenant_id],
                "total": totals[tenant_id],
                "failed": lost[tenant_id],
                "only_failed": only_failed,
            },
        )

    if on_start is not None:
        on_start(len(rows))
    for tenant_id in totals:
        report(tenant_id, force=True)
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        _, failed = experiences_reembed_batch(experience_ids=[pk for pk, _ in chunk])
        for _, tenant_id in chunk:  # a batch succeeds or fails as a whole
            done[tenant_id] += 1
            if failed:
                lost[tenant_id] += 1
        for tenant_id in {tenant_id for _, tenant_id in chunk}:
            report(tenant_id, force=done[tenant_id] == totals[tenant_id])
        if on_batch is not None:
            on_batch(len(chunk))
    failed_total = sum(lost.values())
    return ReembedResult(job=job, total=len(rows), completed=len(rows) - failed_total, failed=failed_total)


def experiences_reembed_batch(*, experience_ids: list[int]) -> tuple[int, int]:
    """Re-embed these experiences now with the configured model: (completed, failed).

    Resets them to pending, then runs the embedding job body inline. Used by `manage.py reembed`
    when the model changes and to recover failed rows.
    """
    with transaction.atomic():
        Experience.objects.filter(pk__in=experience_ids).update(
            embedding_status=EmbeddingStatus.PENDING, embedding_error=""
        )
    try:
        return experiences_embed(experience_ids=experience_ids), 0
    except EmbedderError as exc:
        return 0, experiences_mark_failed(
            experience_ids=experience_ids, reason=f"{type(exc).__name__}: {exc}"
        )
