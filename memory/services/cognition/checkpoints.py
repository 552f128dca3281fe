"""Checkpoints: take one (gapless per-agent seq, delta storage), get, list, diff, restore.

A checkpoint is an immutable snapshot of the agent's cognitive state. It covers the agent's event
stream up to its own `checkpoint.created` event and carries the fold of those events, so recovery
folds only what came after (memory/services/state_fold.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from memory.exceptions import NotFound
from memory.models import (
    STATE_SCHEMA_VERSION,
    Agent,
    Checkpoint,
    CheckpointPolicy,
    CheckpointStorage,
    CognitiveState,
    Event,
    Tenant,
)
from memory.services import recorder
from memory.services.cognition.jsondiff import json_diff, json_pointer, json_sha256, json_text
from memory.services.cognition.schema import STATE_FIELDS, state_normalize, state_patched
from memory.services.cognition.state import (
    STATE_WRITE_FIELDS,
    StateView,
    state_cache_put,
    state_get,
    state_of_row,
    state_row_checkpoint,
    state_row_for_update,
    state_write,
)
from memory.services.cognition.storage import checkpoint_state, checkpoint_storage_for
from memory.services.state_fold import fold_apply, fold_through


def _full_every(tenant: Tenant, row: CognitiveState | None = None) -> int:
    known = getattr(row, "policy_full_every", None)  # read with the locked state row
    return max(1, known if known is not None else CheckpointPolicy.for_tenant(tenant).full_snapshot_every)


def checkpoint_create(
    *,
    tenant: Tenant,
    agent: Agent,
    reason: str = "",
    step: int | None = None,
    produced_by: str = "",
    state: Any = None,
    patch: Any = None,
) -> Checkpoint:
    """Snapshot the agent's cognitive state as its next checkpoint (writing `state` first if given,
    or changing the state by the JSON Patch `patch` first; see state_patched).

    Seqs are gapless per agent (allocated under the state row's lock). The checkpoint covers the
    agent's stream up to its own `checkpoint.created` event, and carries the fold of the agent's
    events up to there (recovery folds only what came after). Not idempotent by itself; use an
    Idempotency-Key. Raises what state_normalize raises, InvalidPatch for a patch that does not apply.
    """

    document = state_normalize(state)[0] if state is not None else None
    with transaction.atomic():
        row = state_row_for_update(tenant=tenant, agent=agent, checkpoint_fold=True)
        stored, stored_sha = state_of_row(row)  # the state before this call
        if patch is not None:
            document = state_patched(document=json.loads(json_text(stored)), patch=patch)  # a copy
        current = stored
        state_event: dict[str, Any] | None = None
        ops: list[dict[str, Any]] | None = None  # the change from `stored`, diffed once
        if document is not None:
            ops = json_diff(stored, document, with_old=False)
            touched = {op["path"][0] for op in ops}
            state_event = state_write(
                tenant=tenant,
                agent=agent,
                row=row,
                document=document,
                event_type="state.updated",
                payload={},
                previous=stored,
                changed=[field for field in STATE_FIELDS if field in touched],
                save=False,  # one UPDATE of the row below, with the checkpoint pointer
            )
            current = document
        current_text = row.document if document is not None else json_text(current)
        previous = _checkpoint_newest(agent=agent, row=row)
        previous_state = None
        if previous is not None:
            # The usual step (write, checkpoint, write, checkpoint): the state before this call is
            # the previous checkpoint's, so no need to rebuild it from its delta chain. The hash
            # recorded on that checkpoint proves it; otherwise rebuild (and verify) as before.
            same = (stored_sha or json_sha256(stored)) == previous.state_sha256
            previous_state = stored if same else checkpoint_state(checkpoint=previous)
            ops = ops if same else None
        storage, base_seq, depth, payload = checkpoint_storage_for(
            state=current,
            previous=previous,
            previous_state=previous_state,
            full_every=_full_every(tenant, row),
            text=current_text,
            delta=ops,
        )
        row.checkpoint_seq += 1
        current_sha = stored_sha if document is None and stored_sha else json_sha256(current)
        checkpoint = Checkpoint(
            tenant=tenant,
            agent=agent,
            seq=row.checkpoint_seq,
            reason=reason,
            step=step,
            produced_by=produced_by,
            schema_version=STATE_SCHEMA_VERSION,
            storage=storage,
            base_seq=base_seq,
            delta_depth=depth,
            payload=payload,
            state_sha256=current_sha,
            state_bytes=len(current_text.encode()),
            covers_event_seq=0,
        )
        created = {
            "checkpoint": checkpoint.public_id,
            "seq": checkpoint.seq,
            "reason": reason,
            "step": step,
            "storage": storage,
            "state_version": row.version,
        }
        entries: list[tuple[str, dict[str, Any]]] = []
        if state_event is not None:
            entries.append(("state.updated", state_event))
        entries.append(("checkpoint.created", created))
        written: list[str] = []
        if document is not None:
            # The state is stored once, in the checkpoint: the row derives from it (see state_of_row).
            row.document = ""
            written = STATE_WRITE_FIELDS
            state_cache_put(current_sha, current_text)
        _checkpoint_record(checkpoint=checkpoint, row=row, previous=previous, entries=entries)
        row.save(update_fields=[*written, "checkpoint_seq", "checkpoint"])
        if not checkpoint.fold_state:  # not continued: fold the stream (as recovery would)
            fold, checkpoint.reducers_sha256 = fold_through(
                tenant=tenant, agent=agent, through_seq=checkpoint.covers_event_seq
            )
            checkpoint.fold_state = json_text(fold)
            Checkpoint.objects.filter(pk=checkpoint.pk).update(
                fold_state=checkpoint.fold_state, reducers_sha256=checkpoint.reducers_sha256
            )
        return checkpoint


def _fold_continued(previous: Checkpoint | None, events: list[Event]) -> tuple[str, str] | None:
    """The fold through `events` (this call's own, just recorded) continued from `previous`'s
    stored fold without a query, valid if they directly follow it on the agent's stream: (the
    fold's text, the reducers' hash); None when it cannot be continued.

    Exact: when nothing happened on the stream in between, and no reducer applies to these events
    (reducers fold only `agent.*` events), the fold under `previous`'s reducers is its fold plus
    these events. (If the reducers changed since, recovery sees the other hash and refolds.)
    """
    if (
        previous is None
        or not previous.fold_state
        or not previous.reducers_sha256
        or events[0].seq != previous.covers_event_seq + 1
        or any(event.type.startswith("agent.") for event in events)
    ):
        return None
    fold = json.loads(previous.fold_state)
    for event in events:  # the payload as stored (JSON), as fold_through would read it back
        fold_apply(fold, event.seq, event.type, json.loads(json_text(event.payload)), [])
    return json_text(fold), previous.reducers_sha256


def _checkpoint_record(
    *,
    checkpoint: Checkpoint,
    row: CognitiveState,
    previous: Checkpoint | None,
    entries: list[tuple[str, dict[str, Any]]],
) -> None:
    """Record the events `entries`, then insert `checkpoint` covering them, with the fold
    continued from `previous` when it can be (_fold_continued). Folds are a cache kept on the
    newest checkpoint and on full snapshots only, so a fold that grows (an `append` reducer) is
    not stored once per checkpoint: a previous delta checkpoint's is cleared."""
    events = recorder.events_append(tenant=checkpoint.tenant, entries=entries, agent=checkpoint.agent)
    checkpoint.covers_event_seq = events[-1].seq
    continued = _fold_continued(previous, events)
    if continued is not None:
        checkpoint.fold_state, checkpoint.reducers_sha256 = continued
    checkpoint.save(force_insert=True)
    if previous is not None and previous.storage == CheckpointStorage.DELTA and previous.fold_state:
        Checkpoint.objects.filter(pk=previous.pk).update(fold_state="", reducers_sha256="")
    row.checkpoint = checkpoint


def _checkpoint_newest(*, agent: Agent, row: CognitiveState) -> Checkpoint | None:
    # The state row points at the newest checkpoint in the usual case (it was the last one taken);
    # after a restore or pruning it may not, and then the query answers.
    checkpoint = state_row_checkpoint(row)
    if checkpoint is not None and checkpoint.seq == row.checkpoint_seq:
        return checkpoint
    return Checkpoint.objects.filter(agent=agent).order_by("-seq").first()


def checkpoint_get(*, tenant: Tenant, agent: Agent, ref: str | int) -> Checkpoint:
    """The agent's checkpoint by seq (digits) or public id; NotFound if missing, pruned or foreign."""
    queryset = Checkpoint.objects.filter(tenant=tenant, agent=agent)
    text = str(ref)
    checkpoint = (
        # isascii: "²".isdigit() is True, and int("²") fails.
        queryset.filter(seq=int(text)).first()
        if text.isascii() and text.isdigit()
        else queryset.filter(public_id=text).first()
    )
    if checkpoint is None:
        raise NotFound.of("checkpoint", text)
    return checkpoint


def checkpoint_latest(*, tenant: Tenant, agent: Agent) -> Checkpoint | None:
    """The agent's newest checkpoint (without its stored fold, loaded on access). Read-only."""
    return _checkpoint_latest(tenant.pk, agent.pk).first()


def _checkpoint_latest(tenant_id: int, agent_id: int) -> QuerySet[Checkpoint]:
    newest_first = Checkpoint.objects.filter(tenant_id=tenant_id, agent_id=agent_id).order_by("-seq")
    return newest_first.defer("fold_state")


def checkpoints_list(*, tenant: Tenant, agent: Agent) -> Any:  # a QuerySet; views paginate it
    """The agent's checkpoints (metadata; states via checkpoint_state). Read-only."""
    return Checkpoint.objects.filter(tenant=tenant, agent=agent).defer("payload", "fold_state")


@dataclass
class CheckpointDiff:
    source: Checkpoint
    target: Checkpoint
    changes: list[dict[str, Any]]


def checkpoint_diff(*, tenant: Tenant, agent: Agent, source: str | int, target: str | int) -> CheckpointDiff:
    """What changed from checkpoint `source` to `target`, one entry per JSON path.

    Each change is `{"path": "/json/pointer", "segments": [...], "change": "added"|"removed"|"changed",
    "old": ..., "new": ...}`. Read-only. NotFound for an unknown checkpoint.
    """
    a = checkpoint_get(tenant=tenant, agent=agent, ref=source)
    b = checkpoint_get(tenant=tenant, agent=agent, ref=target)
    ops = json_diff(checkpoint_state(checkpoint=a), checkpoint_state(checkpoint=b))
    names = {"add": "added", "remove": "removed", "replace": "changed"}
    changes = []
    for op in sorted(ops, key=lambda o: [str(s) for s in o["path"]]):
        change: dict[str, Any] = {
            "path": json_pointer(op["path"]),
            "segments": op["path"],
            "change": names[op["op"]],
        }
        if op["op"] != "add":
            change["old"] = op["old"]
        if op["op"] != "remove":
            change["new"] = op["value"]
        changes.append(change)
    return CheckpointDiff(source=a, target=b, changes=changes)


def state_restore(
    *, tenant: Tenant, agent: Agent, ref: str | int, reason: str = ""
) -> tuple[StateView, Checkpoint]:
    """Make checkpoint `ref`'s state the current state, and checkpoint it as a new checkpoint.

    History is never rewritten: the state gets a new version, a new checkpoint is appended, and
    `state.restored` is recorded naming both checkpoints. NotFound for an unknown checkpoint.
    """
    with transaction.atomic():
        source = checkpoint_get(tenant=tenant, agent=agent, ref=ref)
        document = checkpoint_state(checkpoint=source)
        row = state_row_for_update(tenant=tenant, agent=agent)
        state_write(
            tenant=tenant,
            agent=agent,
            row=row,
            document=document,
            event_type="state.restored",
            payload={"from_checkpoint": source.public_id, "from_seq": source.seq},
        )
        checkpoint = checkpoint_create(
            tenant=tenant,
            agent=agent,
            reason=reason or f"restored from #{source.seq}",
            produced_by=source.public_id,
        )
        return state_get(tenant=tenant, agent=agent), checkpoint


# --- retention ---------------------------------------------------------------------------------
