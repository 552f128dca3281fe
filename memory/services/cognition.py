"""Cognitive state and checkpoints: versioned writes, delta storage, diff, restore, retention.

A state is a JSON document of schema 1 (`STATE_FIELDS`). Checkpoints are immutable snapshots of
it with a gapless per-agent seq; each is stored in full or as a delta (JSON-path operations, the
same ones the diff endpoint shows) from the checkpoint before it, with a full snapshot every K.
Pruning re-bases the deltas that pointed at a pruned checkpoint before deleting it, and every
reconstruction is verified against the SHA-256 recorded when the checkpoint was taken.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jsonpatch
from django.conf import settings
from django.db import connection, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from memory.exceptions import (
    CheckpointCorrupt,
    InvalidPatch,
    InvalidState,
    NotFound,
    PayloadTooLarge,
    SchemaVersionUnsupported,
    VersionConflict,
)
from memory.models import (
    STATE_SCHEMA_VERSION,
    Agent,
    Checkpoint,
    CheckpointPolicy,
    CheckpointStorage,
    CognitiveState,
    Tenant,
)
from memory.services import recorder

# --- JSON helpers ------------------------------------------------------------------------------


def json_text(value: Any) -> str:
    """Compact JSON that keeps key order (what is stored)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_sha256(value: Any) -> str:
    """A hash of the JSON value that ignores object key order."""
    canonical = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _same(a: Any, b: Any) -> bool:
    # `1 == 1.0 == True` in Python, but they are three different JSON values.
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


Path = tuple[str | int, ...]


def json_diff(old: Any, new: Any, *, with_old: bool = True, path: Path = ()) -> list[dict[str, Any]]:
    """The operations that turn `old` into `new`, at JSON-path level.

    Objects are compared key by key and arrays index by index (removals listed from the end), so
    `json_patch_apply(old, json_diff(old, new)) == new`. Each operation is
    `{"op": "add"|"remove"|"replace", "path": [segments], "value": new, "old": old}`; `old` is
    left out when `with_old` is false (what delta storage keeps).
    """
    ops: list[dict[str, Any]] = []
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append(_op("remove", (*path, key), None, old[key], with_old))
        for key, value in new.items():
            if key not in old:
                ops.append(_op("add", (*path, key), value, None, with_old))
            else:
                ops.extend(json_diff(old[key], value, with_old=with_old, path=(*path, key)))
    elif isinstance(old, list) and isinstance(new, list):
        common = min(len(old), len(new))
        for index in range(common):
            ops.extend(json_diff(old[index], new[index], with_old=with_old, path=(*path, index)))
        for index in range(common, len(new)):
            ops.append(_op("add", (*path, index), new[index], None, with_old))
        for index in range(len(old) - 1, common - 1, -1):
            ops.append(_op("remove", (*path, index), None, old[index], with_old))
    elif not _same(old, new):
        ops.append(_op("replace", path, new, old, with_old))
    return ops


def _op(kind: str, path: Path, value: Any, old: Any, with_old: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"op": kind, "path": list(path)}
    if kind != "remove":
        op["value"] = value
    if with_old and kind != "add":
        op["old"] = old
    return op


def json_patch_apply(document: Any, ops: Iterable[dict[str, Any]]) -> Any:
    """Apply `json_diff` operations to `document` in place (returns the result; the root may change)."""
    for op in ops:
        path = op["path"]
        if not path:
            document = copy.deepcopy(op["value"])
            continue
        parent = document
        for segment in path[:-1]:
            parent = parent[segment]
        last = path[-1]
        if op["op"] == "remove":
            parent.pop(last)
        elif op["op"] == "add" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(op["value"]))
        else:
            parent[last] = copy.deepcopy(op["value"])
    return document


def json_pointer(path: Iterable[str | int]) -> str:
    """RFC 6901 JSON Pointer of a path (`/working_memory/notes/3`)."""
    return "".join("/" + str(seg).replace("~", "~0").replace("/", "~1") for seg in path)


# --- the state document ------------------------------------------------------------------------

STATE_FIELDS = ("context", "observation", "working_memory", "decision", "tool_state")
READ_ONLY_FIELDS = frozenset({"agent", "version", "checkpoint", "updated_at", "upgraded_from"})
# Schema 0 (unversioned, legacy): flat goal/constraints, `memory` and `tools`.
LEGACY_FIELDS = {
    "goal": ("context", "goal"),
    "constraints": ("context", "constraints"),
    "memory": ("working_memory", None),
    "tools": ("tool_state", None),
    "observation": ("observation", None),
    "decision": ("decision", None),
}


def empty_state() -> dict[str, Any]:
    return {
        "context": {"goal": None, "constraints": []},
        "observation": None,
        "working_memory": {},
        "decision": None,
        "tool_state": {},
    }


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _require(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if _type_name(value) not in allowed:
        raise InvalidState(
            f"Field {field!r} must be {' or '.join(allowed)}, not {_type_name(value)}.",
            details={"field": field, "expected": list(allowed), "got": _type_name(value)},
        )


def _check_finite(field: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidState(f"Field {field!r} holds a number JSON cannot represent.", details={"field": field})
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(f"{field}.{key}", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(f"{field}[{index}]", item)


def state_normalize(raw: Any) -> tuple[dict[str, Any], int]:
    """Validate a state as written by a client; return (schema-1 document, version it came in).

    Pure. An unversioned state is schema 0 and upgraded; a newer schema raises
    SchemaVersionUnsupported (422) naming both versions; a wrong type raises InvalidState (400)
    naming the field. Read-only fields a client echoes back (version, checkpoint, …) are ignored.
    """
    _require("state", raw, ("object",))
    version: Any = raw.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidState(
            "Field 'schema_version' must be a non-negative integer.",
            details={"field": "schema_version", "got": _type_name(version)},
        )
    if version > STATE_SCHEMA_VERSION:
        raise SchemaVersionUnsupported(
            f"This state has schema_version {version}; this server supports up to {STATE_SCHEMA_VERSION}. "
            "Nothing was stored.",
            details={"schema_version": version, "supported_schema_version": STATE_SCHEMA_VERSION},
        )
    body = {k: v for k, v in raw.items() if k != "schema_version" and k not in READ_ONLY_FIELDS}
    if version == 0:
        body = _upgrade_v0(body)
    unknown = [key for key in body if key not in STATE_FIELDS]
    if unknown:
        raise InvalidState(
            f"Unknown field {unknown[0]!r}; a state has {', '.join(STATE_FIELDS)}.",
            details={"field": unknown[0], "allowed": list(STATE_FIELDS)},
        )
    document = empty_state()
    document.update(body)
    _require("context", document["context"], ("object",))
    if "goal" in document["context"]:
        _require("context.goal", document["context"]["goal"], ("string", "null"))
    if "constraints" in document["context"]:
        _require("context.constraints", document["context"]["constraints"], ("array",))
    _require("observation", document["observation"], ("object", "string", "null"))
    _require("working_memory", document["working_memory"], ("object",))
    _require("decision", document["decision"], ("object", "string", "null"))
    _require("tool_state", document["tool_state"], ("object",))
    for field in STATE_FIELDS:
        _check_finite(field, document[field])
    return {field: document[field] for field in STATE_FIELDS}, version


def _upgrade_v0(body: dict[str, Any]) -> dict[str, Any]:
    upgraded: dict[str, Any] = {}
    for key, value in body.items():
        if key in STATE_FIELDS and key not in LEGACY_FIELDS:
            upgraded[key] = value
            continue
        if key not in LEGACY_FIELDS:
            upgraded[key] = value  # rejected as unknown by the caller, with its name
            continue
        field, sub = LEGACY_FIELDS[key]
        if sub is None:
            upgraded[field] = value
        else:
            context = upgraded.setdefault("context", {"goal": None, "constraints": []})
            _require("context", context, ("object",))
            context[sub] = value
    return upgraded


def state_load(text: str, schema_version: int) -> dict[str, Any]:
    """A stored state document (possibly of an older schema) as schema 1. Fresh objects every call."""
    raw = json.loads(text)
    if schema_version == STATE_SCHEMA_VERSION:
        return raw
    raw["schema_version"] = schema_version
    return state_normalize(raw)[0]


# --- state read / write ------------------------------------------------------------------------


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "schema_version": self.schema_version,
            **copy.deepcopy(self.document),
            "checkpoint": copy.deepcopy(self.checkpoint),
            "version": self.version,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }


def _checkpoint_ref(checkpoint: Checkpoint | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    return {"id": checkpoint.public_id, "seq": checkpoint.seq}


# --- the current state derived from the latest checkpoint ---------------------------------------
# A checkpoint taken with its state (`checkpoint_create(state=…)` or `patch=…`) stores the state
# once, in the checkpoint, and leaves the state row's `document` empty: the current state is then
# that of `row.checkpoint`. Rewriting a large, growing document on the state row at every step
# left a dead copy per step that a plain VACUUM cannot give back (issue 15: 50-67 MB of bloat for
# a 500-turn history). Reading such a state rebuilds it from the checkpoint (verified by its
# SHA-256), or takes it from a small per-process cache of recent states keyed by that hash.

RECENT_STATES_MAX_BYTES = 64 * 1024 * 1024
_recent_states: OrderedDict[str, str] = OrderedDict()  # state SHA-256 -> its JSON text
_recent_states_bytes = 0
_recent_states_lock = threading.Lock()


def _state_remember(sha: str, text: str) -> None:
    global _recent_states_bytes
    if len(text) > RECENT_STATES_MAX_BYTES // 4:
        return
    with _recent_states_lock:
        if sha in _recent_states:
            _recent_states.move_to_end(sha)
            return
        _recent_states[sha] = text
        _recent_states_bytes += len(text)
        while _recent_states_bytes > RECENT_STATES_MAX_BYTES:
            _, dropped = _recent_states.popitem(last=False)
            _recent_states_bytes -= len(dropped)


def _state_recall(sha: str) -> dict[str, Any] | None:
    text = _recent_states.get(sha)
    return None if text is None else dict(json.loads(text))  # a fresh copy


def _row_state(row: CognitiveState) -> tuple[dict[str, Any], str | None]:
    """The current state a state row stands for, and its SHA-256 when known without hashing.

    Raises CheckpointCorrupt if the row defers to a checkpoint that is missing or does not verify.
    """
    if row.document:
        return state_load(row.document, row.schema_version), None
    checkpoint = _row_checkpoint(row)
    if checkpoint is None:
        raise CheckpointCorrupt(details={"state": "derived from a checkpoint that is gone"})
    state = _state_recall(checkpoint.state_sha256)
    if state is None:
        state = checkpoint_state(checkpoint=Checkpoint.objects.get(pk=checkpoint.pk))
        _state_remember(checkpoint.state_sha256, json_text(state))
    return state, checkpoint.state_sha256


def _row_checkpoint(row: CognitiveState) -> Checkpoint | None:
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
        document=_row_state(row)[0],
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
    # Only what the view shows: not the stored fold, nor the checkpoint's payload and fold.
    row = (
        CognitiveState.objects.select_related("checkpoint")
        .only(*STATE_READ_FIELDS, "checkpoint__public_id", "checkpoint__seq", "checkpoint__state_sha256")
        .filter(tenant=tenant, agent=agent)
        .first()
    )
    return _view(agent, row)


def _state_row_for_update(*, tenant: Tenant, agent: Agent) -> CognitiveState:
    """The agent's state row, created if missing, locked until the transaction ends."""
    # The tenant's full-snapshot interval comes along (checkpoint_create needs it): one round trip.
    policy = CheckpointPolicy.objects.filter(tenant=OuterRef("tenant_id")).values("full_snapshot_every")[:1]
    locked = (
        CognitiveState.objects.select_for_update(of=("self",))
        .select_related("checkpoint")
        .defer("fold_state", "checkpoint__payload", "checkpoint__fold_state")  # loaded if ever needed
        .annotate(policy_full_every=Subquery(policy))
    )
    row = locked.filter(agent=agent).first()  # one round trip once the row exists
    if row is not None:
        return row
    CognitiveState.objects.get_or_create(
        agent=agent, defaults={"tenant": tenant, "document": json_text(empty_state())}
    )
    return locked.get(agent=agent)


def state_patched(*, document: dict[str, Any], patch: Any) -> dict[str, Any]:
    """`document` (a schema-1 state, changed in place) with the JSON Patch (RFC 6902) `patch` applied.

    Paths are relative to the state (`/working_memory/notes/0`). Pure. Raises InvalidPatch (422)
    for a malformed patch or one that does not apply (a failed `test`, a missing path); the
    result is then validated like a whole state (state_normalize).
    """
    if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
        raise InvalidPatch(
            "A JSON Patch is a list of operations: [{op, path, value?, from?}, …] (RFC 6902).",
            details={"fields": {"patch": ["Must be a list of operation objects."]}},
        )
    try:
        patched = jsonpatch.JsonPatch(patch).apply(document, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as exc:
        raise InvalidPatch(
            f"The JSON Patch does not apply to the current state: {exc}. Nothing was stored.",
            details={"fields": {"patch": [str(exc)]}},
        ) from None
    if not isinstance(patched, dict):
        raise InvalidPatch(
            "The JSON Patch replaced the whole state with a non-object.",
            details={"fields": {"patch": ["The result must be a state object."]}},
        )
    return state_normalize({"schema_version": STATE_SCHEMA_VERSION, **patched})[0]


def _check_size(text: str, field: str) -> None:
    limit = settings.CTXAPP["CTXAPP_STATE_MAX_BYTES"]
    if len(text.encode()) > limit:
        raise PayloadTooLarge(
            f"The {field} is larger than the limit of {limit} bytes.",
            details={"field": field, "limit_bytes": limit},
        )


STATE_WRITE_FIELDS = ["document", "schema_version", "version", "updated_at"]


def _write_state(
    *,
    tenant: Tenant,
    agent: Agent,
    row: CognitiveState,
    document: dict[str, Any],
    event_type: str,
    payload: dict[str, Any],
    previous: dict[str, Any] | None = None,
    save: bool = True,
) -> dict[str, Any]:
    # save=False: the caller saves the row (with STATE_WRITE_FIELDS) in its own, single UPDATE,
    # and records the returned event payload itself (with its own event, in one statement).
    text = json_text(document)
    _check_size(text, "state")
    previous = _row_state(row)[0] if previous is None else previous
    row.document = text
    row.schema_version = STATE_SCHEMA_VERSION
    row.version += 1
    row.updated_at = timezone.now()
    if save:
        row.save(update_fields=STATE_WRITE_FIELDS)
    changed = [field for field in STATE_FIELDS if not _same(previous[field], document[field])]
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
    *, tenant: Tenant, agent: Agent, raw: Any = None, patch: Any = None, expected_version: int | None = None
) -> StateView:
    """Replace the agent's cognitive state with `raw` (validated and upgraded, see state_normalize),
    or change it by the JSON Patch `patch` (RFC 6902, applied under the row lock; see state_patched).

    Not idempotent by itself (each write is a new version; use an Idempotency-Key). With
    `expected_version`, raises VersionConflict (409) when the stored version differs. Records
    `state.updated` (version and the names of the changed fields; never the content).
    """
    document, came_in = state_normalize(raw) if patch is None else ({}, STATE_SCHEMA_VERSION)
    with transaction.atomic():
        row = _state_row_for_update(tenant=tenant, agent=agent)
        if expected_version is not None and expected_version != row.version:
            raise VersionConflict(details={"expected_version": expected_version, "version": row.version})
        previous = None
        if patch is not None:
            previous = _row_state(row)[0]
            document = state_patched(document=copy.deepcopy(previous), patch=patch)
        _write_state(
            previous=previous,
            tenant=tenant,
            agent=agent,
            row=row,
            document=document,
            event_type="state.updated",
            payload={"upgraded_from": came_in} if came_in != STATE_SCHEMA_VERSION else {},
        )
        return _view(agent, row, upgraded_from=came_in if came_in != STATE_SCHEMA_VERSION else None)


# --- checkpoints -------------------------------------------------------------------------------


def _full_every(tenant: Tenant, row: CognitiveState | None = None) -> int:
    known = getattr(row, "policy_full_every", None)  # read with the locked state row
    return max(1, known if known is not None else CheckpointPolicy.for_tenant(tenant).full_snapshot_every)


def _storage_for(
    *,
    state: dict[str, Any],
    previous: Checkpoint | None,
    previous_state: dict[str, Any] | None,
    full_every: int,
) -> tuple[str, int | None, int, str]:
    """(storage, base_seq, delta_depth, payload) of a checkpoint of `state` following `previous`."""
    full = json_text(state)
    if previous is None or previous_state is None or previous.delta_depth + 1 >= full_every:
        return CheckpointStorage.FULL, None, 0, full
    delta = json_text(json_diff(previous_state, state, with_old=False))
    if len(delta) >= len(full):  # a delta bigger than the state is no saving
        return CheckpointStorage.FULL, None, 0, full
    return CheckpointStorage.DELTA, previous.seq, previous.delta_depth + 1, delta


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
    from memory.services import recovery

    document = state_normalize(state)[0] if state is not None else None
    with transaction.atomic():
        row = _state_row_for_update(tenant=tenant, agent=agent)
        stored, stored_sha = _row_state(row)  # the state before this call
        if patch is not None:
            document = state_patched(document=copy.deepcopy(stored), patch=patch)
        current = stored
        state_event: dict[str, Any] | None = None
        if document is not None:
            state_event = _write_state(
                tenant=tenant,
                agent=agent,
                row=row,
                document=document,
                event_type="state.updated",
                payload={},
                previous=stored,
                save=False,  # one UPDATE of the row below, with the checkpoint pointer
            )
            current = document
        previous = _checkpoint_newest(agent=agent, row=row)
        previous_state = None
        if previous is not None:
            # The usual step (write, checkpoint, write, checkpoint): the state before this call is
            # the previous checkpoint's, so no need to rebuild it from its delta chain. The hash
            # recorded on that checkpoint proves it; otherwise rebuild (and verify) as before.
            same = (stored_sha or json_sha256(stored)) == previous.state_sha256
            previous_state = stored if same else None
            if previous_state is None:
                previous_state = checkpoint_state(checkpoint=previous)
        storage, base_seq, depth, payload = _storage_for(
            state=current,
            previous=previous,
            previous_state=previous_state,
            full_every=_full_every(tenant, row),
        )
        row.checkpoint_seq += 1
        current_text = row.document if document is not None else json_text(current)
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
        # `state.updated` (when this call wrote the state) and `checkpoint.created`, in one statement.
        entries: list[tuple[str, dict[str, Any]]] = []
        if state_event is not None:
            entries.append(("state.updated", state_event))
        entries.append(("checkpoint.created", created))
        event = recorder.events_append(tenant=tenant, agent=agent, entries=entries)[-1]
        checkpoint.covers_event_seq = event.seq
        fold, reducers_sha = recovery.fold_through(tenant=tenant, agent=agent, through_seq=event.seq)
        checkpoint.fold_state = json_text(fold)
        checkpoint.reducers_sha256 = reducers_sha
        checkpoint.save()
        row.checkpoint = checkpoint
        written: list[str] = []
        if document is not None:
            # The state is stored once, in the checkpoint: the row derives from it (see _row_state).
            row.document = ""
            written = STATE_WRITE_FIELDS
            _state_remember(current_sha, current_text)
        # Folds are a cache: keep them on the newest checkpoint and on full snapshots only, so a
        # fold that grows (an `append` reducer) is not stored once per checkpoint.
        clear = previous.pk if previous is not None and previous.storage == CheckpointStorage.DELTA else None
        _state_row_save(row=row, fields=[*written, "checkpoint_seq", "checkpoint"], clear_fold_of=clear)
        return checkpoint


def _state_row_save(*, row: CognitiveState, fields: list[str], clear_fold_of: int | None) -> None:
    """Save `fields` of the state row and, in the same statement, clear checkpoint `clear_fold_of`'s
    stored fold (one round trip instead of two on every checkpoint)."""
    if clear_fold_of is None:
        row.save(update_fields=fields)
        return
    model_fields: list[Any] = [CognitiveState._meta.get_field(name) for name in fields]
    assignments = ", ".join(f'"{field.column}" = %s' for field in model_fields)
    values = [field.get_db_prep_save(getattr(row, field.attname), connection) for field in model_fields]
    checkpoints, states = Checkpoint._meta.db_table, CognitiveState._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH cleared AS (UPDATE {checkpoints} SET fold_state = '', reducers_sha256 = '' WHERE id = %s) "
            f"UPDATE {states} SET {assignments} WHERE id = %s",
            [clear_fold_of, *values, row.pk],
        )


def _checkpoint_newest(*, agent: Agent, row: CognitiveState) -> Checkpoint | None:
    # The state row points at the newest checkpoint in the usual case (it was the last one taken);
    # after a restore or pruning it may not, and then the query answers.
    checkpoint = _row_checkpoint(row)
    if checkpoint is not None and checkpoint.seq == row.checkpoint_seq:
        return checkpoint
    return Checkpoint.objects.filter(agent=agent).order_by("-seq").first()


def checkpoint_get(*, tenant: Tenant, agent: Agent, ref: str | int) -> Checkpoint:
    """The agent's checkpoint by seq (digits) or public id; NotFound if missing, pruned or foreign."""
    queryset = Checkpoint.objects.filter(tenant=tenant, agent=agent)
    text = str(ref)
    checkpoint = (
        queryset.filter(seq=int(text)).first() if text.isdigit() else queryset.filter(public_id=text).first()
    )
    if checkpoint is None:
        raise NotFound.of("checkpoint", text)
    return checkpoint


def checkpoint_latest(*, tenant: Tenant, agent: Agent) -> Checkpoint | None:
    """The agent's newest checkpoint (without its stored fold, loaded on access). Read-only."""
    return Checkpoint.objects.filter(tenant=tenant, agent=agent).defer("fold_state").order_by("-seq").first()


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
        row = _state_row_for_update(tenant=tenant, agent=agent)
        _write_state(
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
        row = _state_row_for_update(tenant=tenant, agent=agent)
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
                storage, base_seq, depth, payload = _storage_for(
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
    from django.db.models import Count

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
