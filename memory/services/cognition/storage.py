"""How a checkpoint's state is stored (in full or as a delta) and rebuilt from storage, verified.

Each checkpoint is stored in full or as a delta (`json_diff` operations without old values) from
the checkpoint before it, with a full snapshot every K (the tenant's `full_snapshot_every`).
Reconstruction is always checked against the SHA-256 recorded when the checkpoint was taken.
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Subquery

from memory.exceptions import CheckpointCorrupt
from memory.models import Checkpoint, CheckpointStorage
from memory.services.cognition.jsondiff import json_diff, json_patch_apply, json_sha256, json_text
from memory.services.cognition.schema import state_load


def checkpoint_storage_for(
    *,
    state: dict[str, Any],
    previous: Checkpoint | None,
    previous_state: dict[str, Any] | None,
    full_every: int,
    text: str | None = None,
    delta: list[dict[str, Any]] | None = None,
) -> tuple[str, int | None, int, str]:
    """(storage, base_seq, delta_depth, payload) of a checkpoint of `state` following `previous`.

    `text` (json_text of `state`) and `delta` (json_diff of `previous_state` and `state`, without
    old values) spare computing them again when the caller has them.
    """
    full = json_text(state) if text is None else text
    if previous is None or previous_state is None or previous.delta_depth + 1 >= full_every:
        return CheckpointStorage.FULL, None, 0, full
    ops = json_diff(previous_state, state, with_old=False) if delta is None else delta
    delta_text = json_text(ops)
    if len(delta_text) >= len(full):  # a delta bigger than the state is no saving
        return CheckpointStorage.FULL, None, 0, full
    return CheckpointStorage.DELTA, previous.seq, previous.delta_depth + 1, delta_text


def checkpoint_state(*, checkpoint: Checkpoint) -> dict[str, Any]:
    """The cognitive state a checkpoint recorded (schema 1), reconstructed and verified. Fresh copy.

    Read-only. Raises CheckpointCorrupt if the reconstruction does not hash to what was recorded.
    """
    if checkpoint.storage == CheckpointStorage.FULL:
        state = state_load(checkpoint.payload, checkpoint.schema_version)
    else:
        # The chain in one round trip: every row from the nearest full snapshot below, up to it.
        base = Subquery(
            Checkpoint.objects.filter(
                agent_id=checkpoint.agent_id, storage=CheckpointStorage.FULL, seq__lt=checkpoint.seq
            )
            .order_by("-seq")
            .values("seq")[:1]
        )
        rows = {
            seq: (storage, base_seq, payload, version)
            for seq, storage, base_seq, payload, version in Checkpoint.objects.filter(
                agent_id=checkpoint.agent_id, seq__gte=base, seq__lt=checkpoint.seq
            ).values_list("seq", "storage", "base_seq", "payload", "schema_version")
        }
        if not any(row[0] == CheckpointStorage.FULL for row in rows.values()):
            raise CheckpointCorrupt(details={"checkpoint": checkpoint.public_id, "missing": "full snapshot"})
        rows[checkpoint.seq] = (
            checkpoint.storage,
            checkpoint.base_seq,
            checkpoint.payload,
            checkpoint.schema_version,
        )
        chain = []
        seq: int | None = checkpoint.seq
        while seq is not None and rows.get(seq, (None,))[0] == CheckpointStorage.DELTA:
            chain.append(rows[seq][2])
            seq = rows[seq][1]
        if seq is None or seq not in rows:
            raise CheckpointCorrupt(details={"checkpoint": checkpoint.public_id, "missing": f"base #{seq}"})
        state = state_load(rows[seq][2], rows[seq][3])
        for delta in reversed(chain):
            state = json_patch_apply(state, json.loads(delta))
    if json_sha256(state) != checkpoint.state_sha256:
        raise CheckpointCorrupt(details={"checkpoint": checkpoint.public_id})
    return state
