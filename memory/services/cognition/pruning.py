"""Checkpoint retention: which checkpoints a tenant's policy keeps, and pruning the rest safely.

Pruning re-bases the deltas that pointed at a pruned checkpoint before deleting it, and checks
each re-based one reconstructs the exact state it recorded.
"""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from memory.exceptions import CheckpointCorrupt
from memory.models import Agent, Checkpoint, CheckpointPolicy, CheckpointStorage, Tenant
from memory.services import recorder
from memory.services.cognition.jsondiff import json_patch_apply, json_sha256
from memory.services.cognition.schema import state_load
from memory.services.cognition.state import state_row_for_update
from memory.services.cognition.storage import checkpoint_storage_for


def checkpoints_to_keep(
    checkpoints: list[tuple[int, datetime]], *, policy: CheckpointPolicy, now: datetime, pinned: set[int]
) -> set[int]:
    """Seqs kept by the policy: the last N, the newest of each hour and of each day in range. Pure."""
    ordered = sorted(checkpoints)
    keep = {seq for seq, _ in ordered[-policy.keep_last :]} if policy.keep_last else set()
    keep |= pinned & {seq for seq, _ in ordered}
    hourly: dict[datetime, int] = {}
    daily: dict[Any, int] = {}
    hour_floor = now - timedelta(hours=policy.keep_hourly_hours)
    day_floor = now - timedelta(days=policy.keep_daily_days)
    for seq, created in ordered:
        if created >= hour_floor:
            hourly[created.replace(minute=0, second=0, microsecond=0)] = seq
        if created >= day_floor:
            daily[created.date()] = seq
    return keep | set(hourly.values()) | set(daily.values())


def checkpoints_prune(*, tenant: Tenant, agent: Agent, now: datetime | None = None) -> list[int]:
    """Delete the agent's checkpoints the retention policy does not keep; return their seqs.

    Idempotent. Before deleting, every kept delta whose base goes away is re-based onto the kept
    checkpoint before it (or stored in full when there is none, or when its chain would exceed the
    full-snapshot interval), and checked to reconstruct the exact state it recorded. The
    checkpoint the state points at is never pruned. Records `retention.evicted` when it deletes.
    """
    now = now or timezone.now()
    policy = CheckpointPolicy.for_tenant(tenant)
    full_every = max(1, policy.full_snapshot_every)
    with transaction.atomic():
        row = state_row_for_update(tenant=tenant, agent=agent)
        metas = list(Checkpoint.objects.filter(agent=agent).order_by("seq").values_list("seq", "created_at"))
        pinned = {row.checkpoint.seq} if row.checkpoint is not None else set()
        keep = checkpoints_to_keep(metas, policy=policy, now=now, pinned=pinned)
        doomed = [seq for seq, _ in metas if seq not in keep]
        if not doomed:
            return []
        first_doomed = doomed[0]
        # Only checkpoints from the full snapshot at or before the first pruned one matter.
        start = (
            Checkpoint.objects.filter(agent=agent, storage=CheckpointStorage.FULL, seq__lte=first_doomed)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
        ) or 0
        running: Any = None
        previous_kept: Checkpoint | None = None
        previous_kept_state: dict[str, Any] | None = None
        rebased: list[int] = []
        for checkpoint in Checkpoint.objects.filter(agent=agent, seq__gte=start).order_by("seq").iterator():
            if checkpoint.storage == CheckpointStorage.FULL:
                running = state_load(checkpoint.payload, checkpoint.schema_version)
            else:
                running = json_patch_apply(running, json.loads(checkpoint.payload))
            if checkpoint.seq not in keep:
                continue
            needs_rebase = checkpoint.storage == CheckpointStorage.DELTA and (
                previous_kept is None
                or checkpoint.base_seq != previous_kept.seq
                or previous_kept.delta_depth + 1 != checkpoint.delta_depth
            )
            if needs_rebase:
                if json_sha256(running) != checkpoint.state_sha256:
                    raise CheckpointCorrupt(details={"checkpoint": checkpoint.public_id})
                storage, base_seq, depth, payload = checkpoint_storage_for(
                    state=running,
                    previous=previous_kept,
                    previous_state=previous_kept_state,
                    full_every=full_every,
                )
                checkpoint.storage, checkpoint.base_seq = storage, base_seq
                checkpoint.delta_depth, checkpoint.payload = depth, payload
                checkpoint.save(update_fields=["storage", "base_seq", "delta_depth", "payload"])
                rebased.append(checkpoint.seq)
            previous_kept = checkpoint
            previous_kept_state = copy.deepcopy(running)
        Checkpoint.objects.filter(agent=agent, seq__in=doomed).delete()
        recorder.event_append(
            tenant=tenant,
            type="retention.evicted",
            agent=agent,
            payload={"kind": "checkpoint", "count": len(doomed), "seqs": doomed, "rebased": rebased},
        )
        return doomed


def agents_with_prunable_checkpoints() -> list[int]:
    """Ids of agents holding more checkpoints than their tenant's keep_last (candidates to prune)."""

    rows = (
        Checkpoint.objects.values("agent_id", "tenant_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("agent_id", "tenant_id", "n")
    )
    result = []
    keep_last: dict[int, int] = {}
    for agent_id, tenant_id, count in rows:
        if tenant_id not in keep_last:
            policy = CheckpointPolicy.objects.filter(tenant_id=tenant_id).first()
            keep_last[tenant_id] = policy.keep_last if policy else CheckpointPolicy().keep_last
        if count > keep_last[tenant_id]:
            result.append(agent_id)
    return result
