"""Creating many experiences in one transaction: the API's bulk call (up to
CTXAPP_EXPERIENCES_BULK_MAX, all or nothing) and a distillation run's records, each with its own
source (`experiences_create_sourced`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from memory.exceptions import InvalidInput
from memory.models import Experience, ExtractionMethod, Session, Task, Tenant
from memory.services import recorder
from memory.services.experiences import records
from memory.services.experiences.queue import embedding_enqueue
from memory.services.experiences.reads import visible_filter
from memory.services.experiences.records import BulkItem, CreateResult, Draft

Identity = tuple[str, str, str, str, str]


@dataclass(frozen=True)
class Source:
    """Where one experience comes from: how it was extracted, and from which task, session and
    messages (its provenance entry; the session is its events' stream)."""

    method: str = ExtractionMethod.MANUAL
    task: Task | None = None
    session: Session | None = None
    message_seqs: list[int] | None = None


@dataclass
class _BulkPlan:
    """What a bulk create writes: new rows, existing rows that absorbed a duplicate, and events."""

    results: list[CreateResult] = field(default_factory=list)
    new_rows: list[Experience] = field(default_factory=list)
    touched: dict[int, Experience] = field(default_factory=dict)  # existing rows that absorbed one
    # The events in item order, as runs of one session (the stream): (session, [(type, payload)]).
    events: list[tuple[Session | None, list[tuple[str, dict[str, Any]]]]] = field(default_factory=list)


def experiences_create_bulk(
    *, tenant: Tenant, items: list[BulkItem], source_task: Task | None = None
) -> list[CreateResult]:
    """Create up to CTXAPP_EXPERIENCES_BULK_MAX experiences at once: all or nothing.

    Every item is checked before anything is written; InvalidInput names each bad field as
    `items[3].problem`. Each item then follows experience_create's rules (an exact duplicate —
    already stored or earlier in this call — merges unless `merge` is false; the same one from the
    same task is "unchanged") in ONE transaction: one locked read of the duplicates, one multi-row
    INSERT, one `experience.created` event per row written together, and the embeddings queued
    after commit in coalesced jobs of CTXAPP_EMBEDDING_BATCH_SIZE rows (not one job per row).
    Returns one result per item, in order.
    """
    _bulk_check(items)
    session = source_task.session if source_task is not None and source_task.session_id else None
    source = Source(task=source_task, session=session)
    return _create_many(tenant=tenant, items=[(item, source) for item in items], bulk=True)


def experiences_create_sourced(*, tenant: Tenant, items: list[tuple[BulkItem, Source]]) -> list[CreateResult]:
    """Create experiences of several sources (a distillation run's tasks) in one go.

    The same outcome, per item and in order, as `experience_create` called once per item
    (exact duplicates — stored or earlier in the list — merge; the same one from the same task
    and method is "unchanged"), with the same `experience.created` / `experience.merged` events
    on each source's session stream; written with one locked duplicate read, one multi-row
    INSERT, one event INSERT per stream and coalesced embedding jobs. The items are not checked
    (extractors produce valid ones). Call inside a transaction or not (it opens its own).
    """
    return _create_many(tenant=tenant, items=items, bulk=False) if items else []


def _create_many(*, tenant: Tenant, items: list[tuple[BulkItem, Source]], bulk: bool) -> list[CreateResult]:
    drafts = [(records.draft_of(item), source) for item, source in items]
    with transaction.atomic():
        # The streams before the duplicates' rows: recorder.streams_lock's rule.
        recorder.streams_lock(tenant=tenant, sessions=[source.session for _, source in drafts])
        canonical = _stored_duplicates(tenant=tenant, drafts=[draft for draft, _ in drafts])
        plan = _bulk_plan(tenant=tenant, drafts=drafts, canonical=canonical, bulk=bulk)
        _bulk_write(tenant=tenant, plan=plan)
    return plan.results


def _bulk_check(items: list[BulkItem]) -> None:
    """Raise InvalidInput for no items, too many, or any bad field (all of them, as items[i].name)."""
    limit = settings.CTXAPP.experiences_bulk_max
    if not items:
        raise InvalidInput("'items' must be a non-empty list.", details={"fields": {"items": ["Required."]}})
    if len(items) > limit:
        raise InvalidInput(
            f"A bulk create holds at most {limit} experiences; got {len(items)}. Split it.",
            details={"fields": {"items": [f"At most {limit} items per call."]}, "limit": limit},
        )
    errors: dict[str, list[str]] = {}
    for index, item in enumerate(items):
        for name, problems in records.experience_input_errors(
            problem=item.problem, confidence=item.confidence, scope=item.scope, user_id=item.user_id
        ).items():
            errors[f"items[{index}].{name}"] = problems
    if errors:
        first = next(iter(errors))
        raise InvalidInput(f"{first}: {errors[first][0]}", details={"fields": errors})


def _stored_duplicates(*, tenant: Tenant, drafts: list[Draft]) -> dict[Identity, Experience]:
    """The oldest visible row of each mergeable draft's identity, locked: one query, not one per item."""
    canonical: dict[Identity, Experience] = {}
    hashes = {draft.digest for draft in drafts if draft.item.merge}
    if not hashes:
        return canonical
    for row in (
        Experience.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, text_hash__in=hashes)
        .filter(visible_filter())
        .select_related("source_task")
        .order_by("-pk")  # the oldest wins (last written into the dict)
    ):
        canonical[(row.text_hash, row.kind, row.scope, row.user_id, row.agent)] = row
    return canonical


def _bulk_plan(
    *,
    tenant: Tenant,
    drafts: list[tuple[Draft, Source]],
    canonical: dict[Identity, Experience],
    bulk: bool,
) -> _BulkPlan:
    """Decide each draft's outcome in order; a later duplicate within the call merges into an earlier one."""
    plan = _BulkPlan()
    events: list[tuple[Session | None, str, Experience | dict[str, Any]]] = []
    for draft, source in drafts:
        entry = records.provenance_entry(
            method=source.method, task=source.task, session=source.session, message_seqs=source.message_seqs
        )
        target = canonical.get(draft.identity) if draft.item.merge else None
        if target is None:
            row = records.row_new(
                tenant=tenant, draft=draft, extraction_method=source.method,
                source_task=source.task, source_session=source.session, entry=entry,
            )  # fmt: skip
            plan.new_rows.append(row)
            if draft.item.merge:
                canonical[draft.identity] = row  # a later duplicate in this call merges into it
            plan.results.append(CreateResult(row, "created"))
            events.append((source.session, "experience.created", row))
        elif records.same_source(target, entry):
            plan.results.append(CreateResult(target, "unchanged"))
        else:
            records.exact_merge_apply(target, confidence=draft.item.confidence, entry=entry)
            if target.pk is not None:
                plan.touched[target.pk] = target
            payload = records.event_payload(target, similarity=1.0, merged="exact duplicate")
            events.append((source.session, "experience.merged", payload))
            plan.results.append(CreateResult(target, "merged"))
    if bulk:  # one source: its `created` events first, then the `merged` ones (as always recorded)
        events.sort(key=lambda event: event[1] != "experience.created")  # stable
    extra = {"bulk": True} if bulk else {}
    for session, kind, subject in events:
        payload = records.created_payload(subject, **extra) if isinstance(subject, Experience) else subject
        if plan.events and plan.events[-1][0] == session:
            plan.events[-1][1].append((kind, payload))
        else:  # the next run of events of one session: one statement, the item order kept
            plan.events.append((session, [(kind, payload)]))
    return plan


def _bulk_write(*, tenant: Tenant, plan: _BulkPlan) -> None:
    """One multi-row INSERT, the absorbing rows' updates, the events (one statement per run of one
    session), and the embedding jobs."""
    Experience.objects.bulk_create(plan.new_rows)
    for row in plan.touched.values():
        row.save(update_fields=records.EXACT_MERGE_FIELDS)
    for session, entries in plan.events:
        recorder.events_append(tenant=tenant, entries=entries, session=session)
    embedding_enqueue([row.pk for row in plan.new_rows])
