"""Creating one experience: exact duplicates merge at once, the rest is queued for embedding."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from memory.exceptions import InvalidInput
from memory.models import Experience, ExperienceKind, ExtractionMethod, Session, Task, Tenant
from memory.services import recorder
from memory.services.experiences.queue import embedding_enqueue
from memory.services.experiences.reads import visible_filter
from memory.services.experiences.reconcile import experience_supersede
from memory.services.experiences.records import (
    EXACT_MERGE_FIELDS,
    BulkItem,
    CreateResult,
    Draft,
    created_payload,
    draft_of,
    event_payload,
    exact_merge_apply,
    experience_input_errors,
    provenance_entry,
    row_new,
    same_source,
)

_INPUT_MESSAGES = {
    "problem": "An experience needs a problem.",
    "confidence": "confidence is between 0 and 1.",
    "user_id": "A user-scoped experience needs a user_id.",
}


def experience_create(
    *,
    tenant: Tenant,
    problem: str,
    cause: str = "",
    solution: str = "",
    confidence: float = 0.5,
    extraction_method: str = ExtractionMethod.MANUAL,
    user_id: str = "",
    scope: str | None = None,
    kind: str = ExperienceKind.EXPERIENCE,
    key: str = "",
    source_task: Task | None = None,
    source_session: Session | None = None,
    message_seqs: list[int] | None = None,
    source: Any = None,
    supersedes: Experience | None = None,
    agent: str = "",
    merge: bool = True,
) -> CreateResult:
    """Store one experience `pending` and queue its embedding (after commit).

    Not a plain insert: an exact duplicate of a visible experience (same text, kind, scope,
    user) merges into it (outcome "merged"), and the same duplicate from the same task and
    method is a no-op (outcome "unchanged"), so re-running a distillation is harmless.
    `merge=False` always inserts a new row, which never merges later either. `agent` records
    the agent's external id (a filter of list and search). `supersedes` hides that older
    experience behind the new one at once. Records `experience.created` / `experience.merged` /
    `experience.superseded`. Raises InvalidInput.
    """
    errors = experience_input_errors(problem=problem, confidence=confidence, scope=scope, user_id=user_id)
    if errors:
        raise InvalidInput(_INPUT_MESSAGES[next(iter(errors))], details={"fields": errors})
    draft = draft_of(
        BulkItem(
            problem=problem, cause=cause, solution=solution, confidence=confidence, user_id=user_id,
            scope=scope, kind=kind, key=key, agent=agent, merge=merge,
        )
    )  # fmt: skip
    if source_session is None and source_task is not None and source_task.session_id:
        source_session = source_task.session
    entry = provenance_entry(
        method=extraction_method, task=source_task, session=source_session, message_seqs=message_seqs,
        source=source,
    )  # fmt: skip
    with transaction.atomic():
        # The stream before the duplicate's row: recorder.streams_lock's rule.
        recorder.stream_lock(tenant=tenant, session=source_session)
        duplicate = _exact_duplicate(tenant=tenant, draft=draft) if merge else None
        if duplicate is not None and supersedes is None:
            return _merge_exact(
                tenant=tenant, duplicate=duplicate, draft=draft, entry=entry, session=source_session
            )
        experience = row_new(
            tenant=tenant, draft=draft, extraction_method=extraction_method, source_task=source_task,
            source_session=source_session, entry=entry,
        )  # fmt: skip
        experience.save(force_insert=True)
        recorder.event_append(
            tenant=tenant,
            type="experience.created",
            session=source_session,
            payload=created_payload(experience),
        )
        if supersedes is not None:
            experience_supersede(tenant=tenant, older=supersedes, newer=experience, reason="explicit")
        embedding_enqueue([experience.pk])
    return CreateResult(experience, "created")


def _exact_duplicate(*, tenant: Tenant, draft: Draft) -> Experience | None:
    """The oldest visible experience with `draft`'s identity, locked. Call inside a transaction."""
    digest, kind, scope, user_id, agent = draft.identity
    return (
        Experience.objects.select_for_update()
        .filter(tenant=tenant, text_hash=digest, kind=kind, scope=scope, user_id=user_id, agent=agent)
        .filter(visible_filter())
        .order_by("pk")
        .first()
    )


def _merge_exact(
    *, tenant: Tenant, duplicate: Experience, draft: Draft, entry: dict[str, Any], session: Session | None
) -> CreateResult:
    """`draft` merges into its exact `duplicate` ("merged"), or it is a re-run ("unchanged")."""
    if same_source(duplicate, entry):
        return CreateResult(duplicate, "unchanged")
    exact_merge_apply(duplicate, confidence=draft.item.confidence, entry=entry)
    duplicate.save(update_fields=EXACT_MERGE_FIELDS)
    recorder.event_append(
        tenant=tenant,
        type="experience.merged",
        session=session,
        payload=event_payload(duplicate, similarity=1.0, merged="exact duplicate"),
    )
    return CreateResult(duplicate, "merged")
