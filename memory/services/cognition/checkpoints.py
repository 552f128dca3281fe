"""Checkpoints: take one (gapless per-agent seq, delta storage), get, list, diff, restore.

A checkpoint is an immutable snapshot of the agent's cognitive state. It covers the agent's event
stream up to its own `checkpoint.created` event and carries the fold of those events, so recovery
folds only what came after (memory/services/state_fold.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet

from ctxapp.infra.prepared import prepared_cursor
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
        # `state.updated` (when this call wrote the state) and `checkpoint.created`, the checkpoint
        # and the state row: one statement.
        entries: list[tuple[str, dict[str, Any]]] = []
        if state_event is not None:
            entries.append(("state.updated", state_event))
        entries.append(("checkpoint.created", created))
        events = recorder.events_build(tenant=tenant, entries=entries, agent=agent)
        continued = _fold_continued(previous, events)
        written: list[str] = []
        if document is not None:
            # The state is stored once, in the checkpoint: the row derives from it (see state_of_row).
            row.document = ""
            written = STATE_WRITE_FIELDS
            state_cache_put(current_sha, current_text)
        # Folds are a cache: keep them on the newest checkpoint and on full snapshots only, so a
        # fold that grows (an `append` reducer) is not stored once per checkpoint.
        clear = previous.pk if previous is not None and previous.storage == CheckpointStorage.DELTA else None
        listened = _checkpoint_insert(
            checkpoint=checkpoint,
            row=row,
            fields=[*written, "checkpoint_seq"],
            clear_fold_of=clear,
            events=events,
            fold=continued,
        )
        if listened:  # a dashboard of the tenant listens (asked in the same statement)
            recorder.events_broadcast(tenant, events)
        if not checkpoint.fold_state:  # not continued: fold the stream (as recovery would)
            fold, checkpoint.reducers_sha256 = fold_through(
                tenant=tenant, agent=agent, through_seq=checkpoint.covers_event_seq
            )
            checkpoint.fold_state = json_text(fold)
            Checkpoint.objects.filter(pk=checkpoint.pk).update(
                fold_state=checkpoint.fold_state, reducers_sha256=checkpoint.reducers_sha256
            )
        return checkpoint


def _fold_continued(previous: Checkpoint | None, events: list[Event]) -> tuple[int, str, str] | None:
    """The fold through `events` (this call's own, about to be recorded), continued from
    `previous`'s stored fold without a query, valid if they directly follow it on the agent's
    stream: (the seq the first must get, the fold's text up to its last seq, the reducers' hash);
    None when it cannot be continued.

    Exact: when nothing happened on the stream in between, and no reducer applies to these events
    (reducers fold only `agent.*` events), the fold under `previous`'s reducers is its fold plus
    these events. (If the reducers changed since, recovery sees the other hash and refolds.) Only
    `last_event_seq` depends on the seqs; every other part of the fold is known before the insert.
    """
    if (
        previous is None
        or not previous.fold_state
        or not previous.reducers_sha256
        or any(event.type.startswith("agent.") for event in events)
    ):
        return None
    fold = json.loads(previous.fold_state)
    for event in events:  # the payload as stored (JSON), as fold_through would read it back
        fold_apply(fold, 0, event.type, json.loads(json_text(event.payload)), [])
    del fold["last_event_seq"]
    fold["last_event_seq"] = 0
    # Its text ends with that seq, which the statement reserving the seqs fills in: the key is put
    # last, and the text is cut before its value.
    head = json_text(fold).removesuffix("0}")  # ends with `"last_event_seq":`
    return previous.covers_event_seq + 1, head, previous.reducers_sha256


def _checkpoint_insert(
    *,
    checkpoint: Checkpoint,
    row: CognitiveState,
    fields: list[str],
    clear_fold_of: int | None,
    events: list[Event],
    fold: tuple[int, str, str] | None,
) -> bool:
    """Record `events`, insert `checkpoint` covering them, save `fields` of the state row pointing
    it at the checkpoint, and clear checkpoint `clear_fold_of`'s stored fold: one statement (was
    four round trips). With `fold` (see _fold_continued), the checkpoint stores that fold when its
    events got the seqs it expects; otherwise none (the caller then folds the stream). Returns
    whether a dashboard of the tenant listens (recorder.listeners_probe)."""
    computed = {"covers_event_seq", "fold_state", "reducers_sha256"}
    inserted = [f for f in Checkpoint._meta.concrete_fields if not f.primary_key and f.name not in computed]
    saved: list[Any] = [CognitiveState._meta.get_field(name) for name in fields]
    checkpoints, states = Checkpoint._meta.db_table, CognitiveState._meta.db_table
    quote = connection.ops.quote_name
    events_sql, params = recorder.events_insert_cte(
        tenant=checkpoint.tenant, key=events[0].stream, events=events
    )
    first_seq, fold_head, reducers_sha = fold if fold is not None else (0, "", "")
    # Whether the events got the seqs the continued fold expects; every value is a parameter.
    expected = "s.last_seq - %s = %s AND %s <> ''"
    expected_params = [len(events) - 1, first_seq, fold_head]
    columns = [*(str(f.column) for f in inserted), "covers_event_seq", "fold_state", "reducers_sha256"]
    sql = (
        f"WITH {events_sql}, c AS (INSERT INTO {checkpoints} ({', '.join(quote(c) for c in columns)}) "
        f"SELECT {'%s, ' * len(inserted)}s.last_seq, "
        f"CASE WHEN {expected} THEN %s::text || s.last_seq::text || '}}' ELSE '' END, "
        f"CASE WHEN {expected} THEN %s ELSE '' END FROM s RETURNING id)"
    )
    params += [field.get_db_prep_save(getattr(checkpoint, field.attname), connection) for field in inserted]
    params += [*expected_params, fold_head, *expected_params, reducers_sha]
    if clear_fold_of is not None:
        sql += f", cleared AS (UPDATE {checkpoints} SET fold_state = '', reducers_sha256 = '' WHERE id = %s)"
        params.append(clear_fold_of)
    assignments = "".join(f"{quote(field.column)} = %s, " for field in saved)
    sql += f" UPDATE {states} SET {assignments}checkpoint_id = (SELECT id FROM c) WHERE id = %s"
    listening, listening_params = recorder.listeners_probe(checkpoint.tenant)
    sql += " RETURNING checkpoint_id, (SELECT array_agg(ARRAY[public_id, id::text, seq::text]) FROM e), "
    sql += listening
    params += [field.get_db_prep_save(getattr(row, field.attname), connection) for field in saved]
    with prepared_cursor() as cursor:
        cursor.execute(sql, [*params, row.pk, *listening_params])
        checkpoint.pk, inserted_events, listened = cursor.fetchone()
    recorder.events_inserted(events, ((p, int(i), int(q)) for p, i, q in inserted_events))
    checkpoint.covers_event_seq = events[-1].seq
    if fold is not None and events[0].seq == first_seq:
        checkpoint.fold_state, checkpoint.reducers_sha256 = f"{fold_head}{events[-1].seq}}}", reducers_sha
    row.checkpoint = checkpoint
    return bool(listened)


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
