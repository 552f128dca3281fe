"""An agent's current cognitive state: read, replace, patch; the per-process cache of recent states.

The state row holds the document, its version and the pointer to the latest checkpoint. Every
write is a new version and records `state.updated` (never the content).
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cachetools import LRUCache
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from memory.exceptions import CheckpointCorrupt, VersionConflict
from memory.models import (
    STATE_SCHEMA_VERSION,
    Agent,
    Checkpoint,
    CheckpointPolicy,
    CognitiveState,
    Tenant,
    empty_state,
)
from memory.services import recorder
from memory.services.cognition.jsondiff import json_same, json_text
from memory.services.cognition.schema import (
    STATE_FIELDS,
    StateInput,
    state_check_size,
    state_load,
    state_patched,
)
from memory.services.cognition.storage import checkpoint_state


@dataclass
class StateView:
    """A copy of an agent's cognitive state; changing it changes nothing stored."""

    agent: str
    schema_version: int
    document: dict[str, Any]
    version: int
    checkpoint: dict[str, Any] | None
    updated_at: datetime | None
    upgraded_from: int | None = None


def _checkpoint_ref(checkpoint: Checkpoint | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    return {"id": checkpoint.public_id, "seq": checkpoint.seq}


# --- the current state derived from the latest checkpoint ---------------------------------------
# A checkpoint taken with its state (`checkpoint_create(state=…)` or `patch=…`) stores the state
# once, in the checkpoint, and leaves the state row's `document` empty: the current state is then
# that of `row.checkpoint`. Rewriting a large, growing document on the state row at every step
# left a dead copy per step that a plain VACUUM cannot give back (50-67 MB of bloat for
# a 500-turn history). Reading such a state rebuilds it from the checkpoint (verified by its
# SHA-256), or takes it from a small per-process cache of recent states keyed by that hash.

RECENT_STATES_MAX_BYTES = 64 * 1024 * 1024
# state SHA-256 -> its JSON text, least recently used out past RECENT_STATES_MAX_BYTES of text
_recent_states: LRUCache[str, str] = LRUCache(maxsize=RECENT_STATES_MAX_BYTES, getsizeof=len)
_recent_states_lock = threading.Lock()


def state_cache_put(sha: str, text: str) -> None:
    """Keep the state JSON `text` (SHA-256 `sha`) in this process's cache; oldest out past the cap."""
    if len(text) > RECENT_STATES_MAX_BYTES // 4:
        return
    with _recent_states_lock:
        _recent_states[sha] = text


def state_cache_get(sha: str) -> dict[str, Any] | None:
    """The cached state of SHA-256 `sha` (a fresh copy), or None."""
    with _recent_states_lock:
        text = _recent_states.get(sha)
    return None if text is None else dict(json.loads(text))  # a fresh copy


def state_of_row(row: CognitiveState) -> tuple[dict[str, Any], str | None]:
    """The current state a state row stands for, and its SHA-256 when known without hashing.

    Raises CheckpointCorrupt if the row defers to a checkpoint that is missing or does not verify.
    """
    if row.document:
        return state_load(row.document, row.schema_version), None
    checkpoint = state_row_checkpoint(row)
    if checkpoint is None:
        raise CheckpointCorrupt(details={"state": "derived from a checkpoint that is gone"})
    state = state_cache_get(checkpoint.state_sha256)
    if state is None:
        state = checkpoint_state(checkpoint=Checkpoint.objects.get(pk=checkpoint.pk))
        state_cache_put(checkpoint.state_sha256, json_text(state))
    return state, checkpoint.state_sha256


def state_row_checkpoint(row: CognitiveState) -> Checkpoint | None:
    """The checkpoint the row points at. The one joined by the row's SELECT … FOR UPDATE may be
    stale or missing: after waiting for the lock, PostgreSQL re-reads the locked row but not the
    joined one; then it is read again here."""
    joined = row.checkpoint
    if row.checkpoint_id is not None and (joined is None or joined.pk != row.checkpoint_id):
        row.checkpoint = Checkpoint.objects.get(pk=row.checkpoint_id)
    return row.checkpoint


def state_materialize_before_delete(*, checkpoint: Checkpoint) -> None:
    """Before `checkpoint` is deleted: copy its state into a state row that derives from it.

    Pruning never deletes such a checkpoint; this covers deletions by hand (the admin).
    """
    for row in CognitiveState.objects.filter(checkpoint=checkpoint, document=""):
        row.document = json_text(checkpoint_state(checkpoint=checkpoint))
        row.schema_version = STATE_SCHEMA_VERSION
        row.save(update_fields=["document", "schema_version"])


def _view(agent: Agent, row: CognitiveState | None, upgraded_from: int | None = None) -> StateView:
    if row is None:
        return StateView(agent.external_id, STATE_SCHEMA_VERSION, empty_state(), 0, None, None)
    return StateView(
        agent=agent.external_id,
        schema_version=STATE_SCHEMA_VERSION,
        document=state_of_row(row)[0],
        version=row.version,
        checkpoint=_checkpoint_ref(row.checkpoint),
        updated_at=row.updated_at,
        upgraded_from=upgraded_from,
    )


STATE_READ_FIELDS = ("tenant", "agent", "schema_version", "document", "version", "checkpoint", "updated_at")


def state_get(*, tenant: Tenant, agent: Agent) -> StateView:
    """The agent's current cognitive state (an empty schema-1 state at version 0 if never written).

    Read-only; returns fresh copies.
    """
    return _view(agent, _state_read(tenant.pk, agent.pk).first())


def _state_read(tenant_id: int, agent_id: int) -> QuerySet[CognitiveState]:
    # Only what the view shows: not the stored fold, nor the checkpoint's payload and fold.
    return (
        CognitiveState.objects.select_related("checkpoint")
        .only(*STATE_READ_FIELDS, "checkpoint__public_id", "checkpoint__seq", "checkpoint__state_sha256")
        .filter(tenant_id=tenant_id, agent_id=agent_id)
    )


def state_row_for_update(*, tenant: Tenant, agent: Agent, checkpoint_fold: bool = False) -> CognitiveState:
    """The agent's state row, created if missing, locked until the transaction ends.

    `checkpoint_fold`: load its checkpoint's stored fold too (checkpoint_create continues it).
    """
    build = _state_locked_with_fold if checkpoint_fold else _state_locked
    row = build(agent.pk).first()  # one round trip once the row exists
    if row is not None:
        return row
    CognitiveState.objects.get_or_create(
        agent=agent, defaults={"tenant": tenant, "document": json_text(empty_state())}
    )
    return build(agent.pk).get()


def _state_locked(agent_id: int, with_fold: bool = False) -> QuerySet[CognitiveState]:
    # The tenant's full-snapshot interval comes along (checkpoint_create needs it): one round trip.
    policy = CheckpointPolicy.objects.filter(tenant=OuterRef("tenant_id")).values("full_snapshot_every")[:1]
    deferred = ["fold_state", "checkpoint__payload"] + ([] if with_fold else ["checkpoint__fold_state"])
    return (
        CognitiveState.objects.select_for_update(of=("self",))
        .select_related("checkpoint")
        .defer(*deferred)  # loaded if ever needed
        .annotate(policy_full_every=Subquery(policy))
        .filter(agent_id=agent_id)
    )


def _state_locked_with_fold(agent_id: int) -> QuerySet[CognitiveState]:
    return _state_locked(agent_id, with_fold=True)


STATE_WRITE_FIELDS = ["document", "schema_version", "version", "updated_at"]


def state_write(
    *,
    tenant: Tenant,
    agent: Agent,
    row: CognitiveState,
    document: dict[str, Any],
    event_type: str,
    payload: dict[str, Any],
    previous: dict[str, Any] | None = None,
    changed: list[str] | None = None,
    save: bool = True,
) -> dict[str, Any]:
    """Write `document` as the locked `row`'s next version; return the `event_type` event's payload.

    Raises PayloadTooLarge. The caller holds the row lock (state_row_for_update). `changed`: the
    fields that differ from `previous`, when the caller knows them (else compared here).
    """
    # save=False: the caller saves the row (with STATE_WRITE_FIELDS) in its own, single UPDATE,
    # and records the returned event payload itself (with its own event, in one statement).
    text = json_text(document)
    state_check_size(text, "state")
    previous = state_of_row(row)[0] if previous is None else previous
    row.document = text
    row.schema_version = STATE_SCHEMA_VERSION
    row.version += 1
    row.updated_at = timezone.now()
    if save:
        row.save(update_fields=STATE_WRITE_FIELDS)
    if changed is None:
        changed = [field for field in STATE_FIELDS if not json_same(previous[field], document[field])]
    event_payload = {
        "version": row.version,
        "schema_version": STATE_SCHEMA_VERSION,
        "changed": changed,
        **payload,
    }
    if save:
        recorder.event_append(tenant=tenant, type=event_type, agent=agent, payload=event_payload)
    return event_payload


def state_put(
    *,
    tenant: Tenant,
    agent: Agent,
    state: StateInput | None = None,
    patch: Any = None,
    expected_version: int | None = None,
) -> StateView:
    """Replace the agent's cognitive state with `state` (checked and upgraded at the edge, see
    state_input_parse), or change it by the JSON Patch `patch` (RFC 6902, applied under the row
    lock; the result is checked like a written state, see state_patched).

    Not idempotent by itself (each write is a new version; use an Idempotency-Key). With
    `expected_version`, raises VersionConflict (409) when the stored version differs. Records
    `state.updated` (version and the names of the changed fields; never the content).
    """
    if patch is None and state is None:
        raise TypeError("state_put needs a state or a patch")
    document, came_in = (state.document, state.came_in) if state is not None else ({}, STATE_SCHEMA_VERSION)
    with transaction.atomic():
        row = state_row_for_update(tenant=tenant, agent=agent)
        if expected_version is not None and expected_version != row.version:
            raise VersionConflict(details={"expected_version": expected_version, "version": row.version})
        previous = None
        if patch is not None:
            previous = state_of_row(row)[0]
            document = state_patched(document=copy.deepcopy(previous), patch=patch)
        state_write(
            previous=previous,
            tenant=tenant,
            agent=agent,
            row=row,
            document=document,
            event_type="state.updated",
            payload={"upgraded_from": came_in} if came_in != STATE_SCHEMA_VERSION else {},
        )
        return _view(agent, row, upgraded_from=came_in if came_in != STATE_SCHEMA_VERSION else None)
