"""Experience memory: create, read, merge, supersede, embed, feedback, promotion, eviction.

Rules (docs/experiences.md explains them):

- An experience is created `pending` and is findable by full text at once; a Celery job embeds
  it (`experiences_embed`), after which it is findable by vector too.
- Only near-identical texts merge, and no text is lost. An exact duplicate (same text, scope,
  user and kind) merges at creation; a near-identical one (cosine >= policy.merge_threshold,
  0.97, AND word-set overlap >= policy.merge_token_overlap, 0.8) merges when it is embedded.
  Merging raises the older row's confidence and use count, appends the newcomer's provenance and
  appends the newcomer's text to the older row's `aliases` (part of its full-text vector, so the
  merged wording stays findable); the newcomer is kept, hidden, with `merged_into`. A row created
  with `merge=False` never merges.
- A contradiction supersedes: when a newer experience has the same problem (problem cosine >=
  policy.supersede_problem_threshold) but a different solution (solution cosine <
  policy.solution_agreement_threshold), the older one gets `superseded_by` and is hidden by
  default; `include_superseded` / `as_of` show history. A caller may also supersede explicitly.
- Nothing in extraction deletes. Capacity eviction (`experiences_evict`) deletes, least
  recently USED first, with a `retention.evicted` event; a caller deletes one row with
  `experience_delete` (`experience.deleted`).

Public functions for other capabilities:

- `experiences_promote(tenant=, user_id=, kind=, key=, content=, source=, session=None)` — the
  decay capability calls it at session end for user preferences, project configuration and
  constraints (kinds `preference`, `project_config`, `constraint`). Idempotent for the same
  content; a new content for the same (user, kind, key) supersedes the old value. Must run inside
  or outside a transaction (it opens its own atomic block).
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, QuerySet, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone
from pgvector.django import CosineDistance

from memory.exceptions import InvalidInput, NotFound
from memory.models import (
    EmbeddingStatus,
    Experience,
    ExperienceFeedback,
    ExperienceKind,
    ExperiencePolicy,
    ExperienceScope,
    ExtractionMethod,
    JobIntent,
    JobStatus,
    Session,
    Task,
    Tenant,
)
from memory.services import jobs, recorder
from memory.services.embedding import EmbedderError, text_hash, vectors_cached

logger = logging.getLogger(__name__)

PROMOTABLE_KINDS = {
    ExperienceKind.PREFERENCE,
    ExperienceKind.PROJECT_CONFIG,
    ExperienceKind.CONSTRAINT,
    ExperienceKind.FACT,
}
KIND_LABELS = {
    ExperienceKind.PREFERENCE: "User preference",
    ExperienceKind.PROJECT_CONFIG: "Project configuration",
    ExperienceKind.CONSTRAINT: "Constraint",
    ExperienceKind.FACT: "Important fact",
}
# A neighbour less similar than this is not even considered for merge / supersede.
RECONCILE_CANDIDATE_FLOOR = 0.55
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class CreateResult:
    experience: Experience
    outcome: str  # "created" | "merged" | "unchanged"


# --- reads -----------------------------------------------------------------------------------------


def experience_get(*, tenant: Tenant, experience_id: str) -> Experience:
    """One experience of `tenant`. Read-only. Raises NotFound for a missing or foreign id."""
    experience = (
        Experience.objects.filter(tenant=tenant, public_id=experience_id)
        .select_related("merged_into", "superseded_by", "source_task", "source_session")
        .first()
    )
    if experience is None:
        raise NotFound.of("experience", experience_id)
    return experience


def visible_filter(*, include_superseded: bool = False, as_of: datetime | None = None) -> Q:
    """Which rows a reader sees: active ones now, or those that were active at `as_of`."""
    if as_of is not None:
        condition = Q(created_at__lte=as_of) & (Q(merged_at__isnull=True) | Q(merged_at__gt=as_of))
        if not include_superseded:
            condition &= Q(superseded_at__isnull=True) | Q(superseded_at__gt=as_of)
        return condition
    condition = Q(merged_into__isnull=True)
    if not include_superseded:
        condition &= Q(superseded_by__isnull=True)
    return condition


def scope_filter(*, user_id: str | None) -> Q:
    """Tenant-wide experiences plus, when `user_id` is given, only that user's own ones."""
    if user_id is None:
        return Q()
    return Q(scope=ExperienceScope.TENANT) | Q(scope=ExperienceScope.USER, user_id=user_id)


def experiences_list(
    *,
    tenant: Tenant,
    user_id: str | None = None,
    kind: str | None = None,
    embedding_status: str | None = None,
    extraction_method: str | None = None,
    include_superseded: bool = False,
    as_of: datetime | None = None,
    agent: str | None = None,
) -> QuerySet[Experience]:
    """The tenant's visible experiences, filtered (`agent`: recorded by that agent). Read-only."""
    queryset = Experience.objects.filter(tenant=tenant).filter(
        visible_filter(include_superseded=include_superseded, as_of=as_of)
    )
    if user_id is not None:
        queryset = queryset.filter(scope_filter(user_id=user_id))
    if kind:
        queryset = queryset.filter(kind=kind)
    if embedding_status:
        queryset = queryset.filter(embedding_status=embedding_status)
    if extraction_method:
        queryset = queryset.filter(extraction_method=extraction_method)
    if agent:
        queryset = queryset.filter(agent=agent)
    return queryset.select_related("merged_into", "superseded_by", "source_task", "source_session")


# --- create, merge, supersede ------------------------------------------------------------------


def _provenance_entry(
    *,
    method: str,
    task: Task | None,
    session: Session | None,
    message_seqs: list[int] | None = None,
    source: Any = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"method": method, "at": timezone.now().isoformat()}
    if task is not None:
        entry["task"] = task.public_id
    if session is not None:
        entry["session"] = session.public_id
    if message_seqs:
        entry["message_seqs"] = sorted(set(message_seqs))
    if source is not None:
        entry["source"] = source
    return entry


def _boosted_confidence(current: float, incoming: float) -> float:
    """Agreement raises confidence toward 1, never past it (a damped noisy-OR)."""
    return round(min(1.0, 1.0 - (1.0 - current) * (1.0 - 0.5 * incoming)), 4)


def _event_payload(experience: Experience, **extra: Any) -> dict[str, Any]:
    return {
        "experience": experience.public_id,
        "extraction_method": experience.extraction_method,
        "kind": experience.kind,
        **({"task": experience.source_task.public_id} if experience.source_task_id else {}),  # type: ignore[union-attr]
        **extra,
    }


_local = threading.local()


def _enqueue_embedding(ids: list[int]) -> None:
    """Record the embedding job of `ids` in the current transaction (memory.services.jobs).

    Coalesced: all experiences written in one transaction share one job intent per batch
    (CTXAPP_EMBEDDING_BATCH_SIZE), and a worker taking one intent also takes other pending
    ones up to a batch, so 42 single-row writes cost a few jobs, not 42. The job is
    dispatched after commit; a broker that is down never fails the write.
    """
    if not ids:
        return
    with transaction.atomic():
        connection_ = transaction.get_connection()
        batch = settings.CTXAPP.embedding_batch_size
        open_intent: tuple[int, list[int]] | None = getattr(_local, "embed_intent", None)
        # Our intent belongs to this transaction only while its dispatch callback is registered
        # (after a commit or a rollback the callback list is cleared): otherwise start a new one.
        if open_intent is not None and not any(
            entry[1] is _embed_marker for entry in connection_.run_on_commit
        ):
            open_intent = None
        while ids:
            if open_intent is None or len(open_intent[1]) >= batch:
                chunk, ids = ids[:batch], ids[batch:]
                intent_id = jobs.job_enqueue(
                    tenant=None, kind=jobs.EMBED, key=f"tx-{secrets.token_hex(8)}", payload={"ids": chunk}
                )
                assert intent_id is not None  # a fresh key never coalesces
                open_intent = _local.embed_intent = (intent_id, list(chunk))
                if not any(entry[1] is _embed_marker for entry in connection_.run_on_commit):
                    transaction.on_commit(_embed_marker)
            else:
                room = batch - len(open_intent[1])
                merged = [*open_intent[1], *ids[:room]]
                if jobs.job_intent_update_payload(intent_id=open_intent[0], payload={"ids": merged}):
                    open_intent[1][:] = merged
                    ids = ids[room:]
                else:  # no longer pending (taken meanwhile): a new intent for the rest
                    open_intent = None


def _embed_marker() -> None:
    """Marks, in the connection's on-commit list, that this transaction has an open embedding intent."""
    _local.embed_intent = None


def _send_embedding_jobs(ids: list[int]) -> None:
    """Queue the embedding of `ids` now (outside any caller's transaction): same as _enqueue_embedding."""
    _enqueue_embedding(ids)


def experience_input_errors(
    *, problem: str, confidence: float, scope: str | None, user_id: str
) -> dict[str, list[str]]:
    """Field errors of one experience to create (empty when it is valid)."""
    errors: dict[str, list[str]] = {}
    if not problem.strip():
        errors["problem"] = ["Required."]
    if not 0.0 <= confidence <= 1.0:
        errors["confidence"] = ["0..1"]
    if scope == ExperienceScope.USER and not user_id:
        errors["user_id"] = ["Required for scope user."]
    return errors


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
        first = next(iter(errors))
        messages = {
            "problem": "An experience needs a problem.",
            "confidence": "confidence is between 0 and 1.",
            "user_id": "A user-scoped experience needs a user_id.",
        }
        raise InvalidInput(messages[first], details={"fields": errors})
    problem, cause, solution = problem.strip(), cause.strip(), solution.strip()
    scope = scope or (ExperienceScope.USER if user_id else ExperienceScope.TENANT)
    if source_session is None and source_task is not None and source_task.session_id:
        source_session = source_task.session
    digest = text_hash(Experience.compose_text(problem, cause, solution))
    entry = _provenance_entry(
        method=extraction_method,
        task=source_task,
        session=source_session,
        message_seqs=message_seqs,
        source=source,
    )
    with transaction.atomic():
        duplicate = (
            Experience.objects.select_for_update()
            .filter(tenant=tenant, text_hash=digest, kind=kind, scope=scope, user_id=user_id, agent=agent)
            .filter(visible_filter())
            .order_by("pk")
            .first()
            if merge
            else None
        )
        if duplicate is not None and supersedes is None:
            same_source = any(
                p.get("method") == entry["method"] and p.get("task") == entry.get("task") and "task" in entry
                for p in duplicate.provenance
            )
            if same_source:
                return CreateResult(duplicate, "unchanged")
            duplicate.confidence = _boosted_confidence(duplicate.confidence, confidence)
            duplicate.use_count += 1
            duplicate.merge_count += 1
            duplicate.provenance = [*duplicate.provenance, {**entry, "merge": "exact"}]
            duplicate.updated_at = timezone.now()
            duplicate.save(
                update_fields=["confidence", "use_count", "merge_count", "provenance", "updated_at"]
            )
            recorder.event_append(
                tenant=tenant,
                type="experience.merged",
                session=source_session,
                payload=_event_payload(duplicate, similarity=1.0, merged="exact duplicate"),
            )
            return CreateResult(duplicate, "merged")
        experience = Experience.objects.create(
            tenant=tenant,
            user_id=user_id,
            scope=scope,
            kind=kind,
            key=key,
            problem=problem,
            cause=cause,
            solution=solution,
            confidence=confidence,
            extraction_method=extraction_method,
            source_task=source_task,
            source_session=source_session,
            provenance=[entry],
            text_hash=digest,
            agent=agent,
            mergeable=merge,
        )
        recorder.event_append(
            tenant=tenant,
            type="experience.created",
            session=source_session,
            payload=_event_payload(
                experience,
                embedding_status=experience.embedding_status,
                **({"agent": agent} if agent else {}),
                **({} if merge else {"merge": False}),
            ),
        )
        if supersedes is not None:
            experience_supersede(tenant=tenant, older=supersedes, newer=experience, reason="explicit")
        _enqueue_embedding([experience.pk])
    return CreateResult(experience, "created")


@dataclass(frozen=True)
class BulkItem:
    """One experience of a bulk create (the API's validated item)."""

    problem: str
    cause: str = ""
    solution: str = ""
    confidence: float = 0.5
    user_id: str = ""
    scope: str | None = None
    kind: str = ExperienceKind.EXPERIENCE
    key: str = ""
    agent: str = ""
    merge: bool = True


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
        for name, problems in experience_input_errors(
            problem=item.problem, confidence=item.confidence, scope=item.scope, user_id=item.user_id
        ).items():
            errors[f"items[{index}].{name}"] = problems
    if errors:
        first = next(iter(errors))
        raise InvalidInput(f"{first}: {errors[first][0]}", details={"fields": errors})
    source_session = source_task.session if source_task is not None and source_task.session_id else None
    prepared = []
    for item in items:
        problem, cause, solution = item.problem.strip(), item.cause.strip(), item.solution.strip()
        scope = item.scope or (ExperienceScope.USER if item.user_id else ExperienceScope.TENANT)
        digest = text_hash(Experience.compose_text(problem, cause, solution))
        identity = (digest, item.kind, scope, item.user_id, item.agent)
        prepared.append((item, problem, cause, solution, scope, digest, identity))
    with transaction.atomic():
        # One locked read finds every exact duplicate that already exists (not one query per item).
        canonical: dict[tuple[str, str, str, str, str], Experience] = {}
        hashes = {p[5] for p in prepared if p[0].merge}
        if hashes:
            for row in (
                Experience.objects.select_for_update(of=("self",))
                .filter(tenant=tenant, text_hash__in=hashes)
                .filter(visible_filter())
                .select_related("source_task")
                .order_by("-pk")  # the oldest wins (last written into the dict)
            ):
                canonical[(row.text_hash, row.kind, row.scope, row.user_id, row.agent)] = row
        results: list[CreateResult] = []
        new_rows: list[Experience] = []
        touched: dict[int, Experience] = {}  # existing rows that absorbed a duplicate
        merged_payloads: list[dict[str, Any]] = []
        for item, problem, cause, solution, scope, digest, identity in prepared:
            entry = _provenance_entry(
                method=ExtractionMethod.MANUAL, task=source_task, session=source_session
            )
            target = canonical.get(identity) if item.merge else None
            if target is not None:
                same_source = "task" in entry and any(
                    p.get("method") == entry["method"] and p.get("task") == entry["task"]
                    for p in target.provenance
                )
                if same_source:
                    results.append(CreateResult(target, "unchanged"))
                    continue
                target.confidence = _boosted_confidence(target.confidence, item.confidence)
                target.use_count += 1
                target.merge_count += 1
                target.provenance = [*target.provenance, {**entry, "merge": "exact"}]
                target.updated_at = timezone.now()
                if target.pk is not None:
                    touched[target.pk] = target
                merged_payloads.append(_event_payload(target, similarity=1.0, merged="exact duplicate"))
                results.append(CreateResult(target, "merged"))
                continue
            row = Experience(
                tenant=tenant,
                user_id=item.user_id,
                scope=scope,
                kind=item.kind,
                key=item.key,
                problem=problem,
                cause=cause,
                solution=solution,
                confidence=item.confidence,
                extraction_method=ExtractionMethod.MANUAL,
                source_task=source_task,
                source_session=source_session,
                provenance=[entry],
                text_hash=digest,
                agent=item.agent,
                mergeable=item.merge,
            )
            new_rows.append(row)
            if item.merge:
                canonical[identity] = row  # a later duplicate in this call merges into it
            results.append(CreateResult(row, "created"))
        Experience.objects.bulk_create(new_rows)
        for row in touched.values():
            row.save(update_fields=["confidence", "use_count", "merge_count", "provenance", "updated_at"])
        recorder.event_append_many(
            tenant=tenant,
            type="experience.created",
            session=source_session,
            payloads=[
                _event_payload(
                    row,
                    embedding_status=row.embedding_status,
                    bulk=True,
                    **({"agent": row.agent} if row.agent else {}),
                    **({} if row.mergeable else {"merge": False}),
                )
                for row in new_rows
            ],
        )
        recorder.event_append_many(
            tenant=tenant, type="experience.merged", session=source_session, payloads=merged_payloads
        )
        _enqueue_embedding([row.pk for row in new_rows])
    return results


@dataclass(frozen=True)
class DeleteResult:
    experience_id: str
    duplicates_deleted: list[str]
    restored: list[str]


def experience_delete(*, tenant: Tenant, experience: Experience) -> DeleteResult:
    """Delete one experience of `tenant` for good, with the hidden duplicates merged into it.

    Rows it superseded become visible again (their supersede link and time are cleared): the
    replacement is gone. Records `experience.deleted` with what went and what came back.
    Raises NotFound for another tenant's row.
    """
    if experience.tenant_id != tenant.pk:
        raise NotFound.of("experience", experience.public_id)
    with transaction.atomic():
        locked = Experience.objects.select_for_update().filter(tenant=tenant, pk=experience.pk).first()
        if locked is None:  # deleted meanwhile
            raise NotFound.of("experience", experience.public_id)
        duplicates = list(
            Experience.objects.filter(tenant=tenant, merged_into=locked).values_list("public_id", flat=True)
        )
        restored = list(
            Experience.objects.filter(tenant=tenant, superseded_by=locked).values_list("public_id", flat=True)
        )
        Experience.objects.filter(tenant=tenant, superseded_by=locked).update(
            superseded_by=None, superseded_at=None, updated_at=timezone.now()
        )
        Experience.objects.filter(tenant=tenant, merged_into=locked).delete()
        payload = _event_payload(
            locked, duplicates_deleted=duplicates[:100], restored=restored[:100], problem=locked.problem[:200]
        )
        session = locked.source_session
        locked.delete()
        recorder.event_append(tenant=tenant, type="experience.deleted", session=session, payload=payload)
    return DeleteResult(experience.public_id, duplicates, restored)


# The per-tenant experience policy fields a caller may read and change through the API.
POLICY_FIELDS = (
    "capacity",
    "merge_threshold",
    "merge_token_overlap",
    "supersede_problem_threshold",
    "solution_agreement_threshold",
    "vector_weight",
    "text_weight",
    "context_min_similarity",
    "helpful_weight",
)


def experience_policy_get(*, tenant: Tenant) -> ExperiencePolicy:
    """The tenant's experience policy (created with the defaults on first use)."""
    return ExperiencePolicy.for_tenant(tenant)


def experience_policy_update(
    *, tenant: Tenant, changes: dict[str, Any], actor: str = "api"
) -> ExperiencePolicy:
    """Change some of the tenant's experience policy fields (POLICY_FIELDS); the rest keep their value.

    Records `policy.updated` with the old and new values. A lower capacity is enforced by the
    eviction beat job (every 10 minutes). Raises InvalidInput for an unknown field.
    """
    unknown = sorted(set(changes) - set(POLICY_FIELDS))
    if unknown:
        raise InvalidInput(
            f"Unknown policy field(s): {', '.join(unknown)}.",
            details={"fields": {name: ["Unknown field."] for name in unknown}},
        )
    with transaction.atomic():
        ExperiencePolicy.for_tenant(tenant)
        policy = ExperiencePolicy.objects.select_for_update().get(tenant=tenant)
        before = {name: getattr(policy, name) for name in changes}
        for name, value in changes.items():
            setattr(policy, name, value)
        if changes:
            policy.save(update_fields=list(changes))
            recorder.event_append(
                tenant=tenant,
                type="policy.updated",
                payload={"policy": "experiences", "actor": actor, "before": before, "after": dict(changes)},
            )
    return policy


def experience_merge(*, tenant: Tenant, duplicate: Experience, into: Experience, similarity: float) -> None:
    """Fold `duplicate` into the older `into`: confidence and use count up, provenance kept.

    `duplicate`'s text joins `into.aliases` (searchable by full text); `duplicate` stays, hidden,
    with merged_into. Call inside a transaction. Records experience.merged.
    """
    now = timezone.now()
    into.confidence = _boosted_confidence(into.confidence, duplicate.confidence)
    into.use_count += 1 + duplicate.use_count
    into.merge_count += 1
    into.helpful_count += duplicate.helpful_count
    into.unhelpful_count += duplicate.unhelpful_count
    into.provenance = [
        *into.provenance,
        *({**p, "merged_from": duplicate.public_id} for p in duplicate.provenance),
    ]
    # The duplicate's own wording (and what was merged into it) stays findable by full text.
    # One alias per line (the text on one line).
    current = [line for line in into.aliases.splitlines() if line]
    known = {*current, " ".join(into.text.split())}
    incoming = [" ".join(duplicate.text.split()), *duplicate.aliases.splitlines()]
    added = [t for t in dict.fromkeys(incoming) if t and t not in known]
    into.aliases = "\n".join([*current, *added])
    into.updated_at = now
    into.save(
        update_fields=[
            "confidence", "use_count", "merge_count", "helpful_count", "unhelpful_count", "provenance",
            "aliases", "updated_at",
        ]
    )  # fmt: skip
    duplicate.merged_into = into
    duplicate.merged_at = now
    duplicate.updated_at = now
    duplicate.save(update_fields=["merged_into", "merged_at", "updated_at"])
    recorder.event_append(
        tenant=tenant,
        type="experience.merged",
        session=duplicate.source_session,
        payload=_event_payload(into, merged=duplicate.public_id, similarity=round(similarity, 4)),
    )


def experience_supersede(
    *, tenant: Tenant, older: Experience, newer: Experience, reason: str, **scores: float
) -> None:
    """Hide `older` behind `newer` (kept, linked). Call inside a transaction.

    Records experience.superseded.
    """
    if older.tenant_id != tenant.pk or newer.tenant_id != tenant.pk:
        raise NotFound.of("experience", older.public_id)
    now = timezone.now()
    older.superseded_by = newer
    older.superseded_at = now
    older.updated_at = now
    older.save(update_fields=["superseded_by", "superseded_at", "updated_at"])
    recorder.event_append(
        tenant=tenant,
        type="experience.superseded",
        session=newer.source_session,
        payload=_event_payload(
            older, superseded_by=newer.public_id, reason=reason, **{k: round(v, 4) for k, v in scores.items()}
        ),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def token_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' lower-cased word sets (1.0 = the same words)."""
    left, right = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


def merge_allowed(
    *, duplicate: Experience, into: Experience, similarity: float, policy: ExperiencePolicy
) -> bool:
    """Whether `duplicate` may merge into `into`: near-identical only (cosine AND word overlap).

    A paraphrase scores a high cosine (0.9+) yet says something in other words that a reader
    may search for; only a cosine >= policy.merge_threshold (0.97) with a word-set overlap >=
    policy.merge_token_overlap (0.8) counts as the same text. A row created with merge=False
    never merges into another.
    """
    if not duplicate.mergeable:
        return False
    if similarity < policy.merge_threshold:
        return False
    return token_overlap(duplicate.text, into.text) >= policy.merge_token_overlap


def _reconcile(*, experience: Experience, policy: ExperiencePolicy) -> str | None:
    """After `experience` got its vector: merge it into, or let it supersede, its nearest neighbour."""
    if experience.kind != ExperienceKind.EXPERIENCE or experience.embedding is None:
        return None
    neighbour_query = (
        Experience.objects.filter(
            tenant_id=experience.tenant_id,
            kind=experience.kind,
            scope=experience.scope,
            user_id=experience.user_id,
            agent=experience.agent,
            embedding_status=EmbeddingStatus.COMPLETED,
            merged_into__isnull=True,
            superseded_by__isnull=True,
        )
        .exclude(pk=experience.pk)
        .annotate(distance=CosineDistance("embedding", experience.embedding))
        .order_by("distance")
        .select_related("source_session")
        .defer("embedding", "problem_embedding", "search_vector")
    )
    if experience.problem_embedding is not None:
        neighbour_query = neighbour_query.annotate(
            problem_distance=CosineDistance("problem_embedding", experience.problem_embedding)
        )
    neighbour = neighbour_query.first()
    if neighbour is None:
        return None
    similarity = 1.0 - float(neighbour.distance)
    if similarity < RECONCILE_CANDIDATE_FLOOR:
        return None
    tenant = experience.tenant
    problem_distance = getattr(neighbour, "problem_distance", None)
    # Problems are compared on the stored problem vectors; only a pair about the same problem
    # pays for embedding its two solutions (cached by text).
    problem_similarity = 1.0 - float(problem_distance) if problem_distance is not None else similarity
    if (
        experience.solution
        and neighbour.solution
        and problem_similarity >= policy.supersede_problem_threshold
    ):
        texts = [experience.solution, neighbour.solution]
        _, by_hash = vectors_cached({text_hash(t): t for t in texts})
        solution_similarity = _cosine(by_hash[text_hash(texts[0])], by_hash[text_hash(texts[1])])
        if (
            problem_similarity >= policy.supersede_problem_threshold
            and solution_similarity < policy.solution_agreement_threshold
        ):
            older, newer = (
                (neighbour, experience)
                if neighbour.created_at <= experience.created_at
                else (experience, neighbour)
            )
            experience_supersede(
                tenant=tenant,
                older=older,
                newer=newer,
                reason="contradiction",
                problem_similarity=problem_similarity,
                solution_similarity=solution_similarity,
            )
            return "superseded"
    duplicate, into = (
        (experience, neighbour) if neighbour.created_at <= experience.created_at else (neighbour, experience)
    )
    if merge_allowed(duplicate=duplicate, into=into, similarity=similarity, policy=policy):
        experience_merge(tenant=tenant, duplicate=duplicate, into=into, similarity=similarity)
        return "merged"
    return None


# --- embedding -------------------------------------------------------------------------------------


def experiences_embed(*, experience_ids: list[int]) -> int:
    """Embed the still-pending experiences among `experience_ids`; return how many were completed.

    Idempotent: rows no longer pending are skipped, and rows are re-checked and written under
    `SELECT … FOR UPDATE SKIP LOCKED` in one transaction, so a redelivered job (the worker died
    after embedding but before the ack) or a concurrent duplicate never writes a row twice.
    Each written row gets `embedding_attempts + 1`, `embedded_at`, an `experience.embedded`
    event, and is then merged / superseded against its neighbours. Raises EmbedderUnavailable
    (transient, the job retries) or EmbedderError (permanent).
    """
    rows = list(
        Experience.objects.filter(pk__in=experience_ids, embedding_status=EmbeddingStatus.PENDING).only(
            "pk", "problem", "cause", "solution", "text_hash"
        )
    )
    if not rows:
        return 0
    texts = {row.text_hash: row.text for row in rows}
    texts.update({text_hash(row.problem_text): row.problem_text for row in rows})
    model_name, vectors = vectors_cached(texts)
    now = timezone.now()
    done = 0
    with transaction.atomic():
        locked = list(
            Experience.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=[row.pk for row in rows], embedding_status=EmbeddingStatus.PENDING)
            .select_related("tenant", "source_task", "source_session")
            .order_by("created_at", "pk")
        )
        policies: dict[int, ExperiencePolicy] = {}
        for experience in locked:
            vector = vectors.get(experience.text_hash)
            if vector is None:  # text changed since the read above (never in practice): next job
                continue
            experience.embedding = vector
            experience.problem_embedding = vectors[text_hash(experience.problem_text)]
            experience.embedding_model = model_name
            experience.embedding_dimensions = len(vector)
            experience.embedding_status = EmbeddingStatus.COMPLETED
            experience.embedding_error = ""
            experience.embedding_attempts += 1
            experience.embedded_at = now
            experience.save(
                update_fields=[
                    "embedding", "problem_embedding", "embedding_model", "embedding_dimensions",
                    "embedding_status", "embedding_error", "embedding_attempts", "embedded_at",
                ]
            )  # fmt: skip
            recorder.event_append(
                tenant=experience.tenant,
                type="experience.embedded",
                session=experience.source_session,
                payload=_event_payload(experience, model=model_name, dimensions=len(vector)),
            )
            policy = policies.get(experience.tenant_id)
            if policy is None:
                policy = policies[experience.tenant_id] = ExperiencePolicy.for_tenant(experience.tenant)
            _reconcile(experience=experience, policy=policy)
            done += 1
    return done


def experiences_mark_failed(*, experience_ids: list[int], reason: str) -> int:
    """Mark the still-pending experiences among `experience_ids` failed with `reason`. Idempotent."""
    reason = reason[:2000]
    with transaction.atomic():
        rows = list(
            Experience.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=experience_ids, embedding_status=EmbeddingStatus.PENDING)
            .select_related("tenant", "source_task", "source_session")
        )
        for experience in rows:
            experience.embedding_status = EmbeddingStatus.FAILED
            experience.embedding_error = reason
            experience.save(update_fields=["embedding_status", "embedding_error"])
            recorder.event_append(
                tenant=experience.tenant,
                type="experience.embedding_failed",
                session=experience.source_session,
                payload=_event_payload(experience, reason=reason),
            )
    if rows:
        logger.warning("embedding failed for %d experiences: %s", len(rows), reason)
    return len(rows)


def experiences_retry_failed(*, tenant: Tenant | None = None, experience_ids: list[str] | None = None) -> int:
    """Put failed experiences (of `tenant`, or all) back to pending and queue their embedding.

    Idempotent; returns how many were re-queued. Records `experience.embedding_retried` per tenant.
    """
    with transaction.atomic():
        queryset = Experience.objects.select_for_update().filter(embedding_status=EmbeddingStatus.FAILED)
        if tenant is not None:
            queryset = queryset.filter(tenant=tenant)
        if experience_ids is not None:
            queryset = queryset.filter(public_id__in=experience_ids)
        rows = list(queryset.select_related("tenant").order_by("pk"))
        by_tenant: dict[int, list[Experience]] = {}
        for row in rows:
            by_tenant.setdefault(row.tenant_id, []).append(row)
        Experience.objects.filter(pk__in=[r.pk for r in rows]).update(
            embedding_status=EmbeddingStatus.PENDING, embedding_error=""
        )
        for items in by_tenant.values():
            recorder.event_append(
                tenant=items[0].tenant,
                type="experience.embedding_retried",
                payload={"experiences": [r.public_id for r in items[:100]], "count": len(items)},
            )
        _enqueue_embedding([r.pk for r in rows])
    return len(rows)


def experiences_requeue_stale(*, older_than: timedelta | None = None) -> int:
    """Re-queue embedding of experiences pending for longer than `older_than` (a lost job).

    Safe to run at any time: the embedding job skips rows that are no longer pending.
    """
    minutes = settings.CTXAPP.embedding_stale_minutes
    cutoff = timezone.now() - (older_than if older_than is not None else timedelta(minutes=minutes))
    ids = list(
        Experience.objects.filter(embedding_status=EmbeddingStatus.PENDING, created_at__lt=cutoff)
        .order_by("pk")
        .values_list("pk", flat=True)[:10_000]
    )
    # Rows an open job intent already holds (waiting, running, or backing off) are not lost.
    held: set[int] = set()
    for payload in JobIntent.objects.filter(
        kind=jobs.EMBED, status__in=[JobStatus.PENDING, JobStatus.RUNNING]
    ).values_list("payload", flat=True):
        held.update(int(i) for i in (payload or {}).get("ids", []))
    ids = [i for i in ids if i not in held]
    with transaction.atomic():
        _enqueue_embedding(ids)
    return len(ids)


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


# --- use, feedback ---------------------------------------------------------------------------------


def experiences_touch(*, tenant: Tenant, experience_ids: list[str]) -> int:
    """Count one use of each experience (use count + 1, last used = now). Returns rows touched."""
    if not experience_ids:
        return 0
    return Experience.objects.filter(tenant=tenant, public_id__in=experience_ids).update(
        use_count=F("use_count") + 1, last_used_at=timezone.now()
    )


def experience_feedback(
    *, tenant: Tenant, experience: Experience, helpful: bool, note: str = "", session: Session | None = None
) -> Experience:
    """Record an agent's outcome report; ranking uses helpful - unhelpful. Not idempotent (each call counts).

    Records `experience.feedback`.
    """
    field = "helpful_count" if helpful else "unhelpful_count"
    with transaction.atomic():
        ExperienceFeedback.objects.create(
            tenant=tenant, experience=experience, helpful=helpful, note=note, session=session
        )
        Experience.objects.filter(pk=experience.pk).update(**{field: F(field) + 1})
        experience.refresh_from_db(fields=["helpful_count", "unhelpful_count"])
        recorder.event_append(
            tenant=tenant,
            type="experience.feedback",
            session=session,
            payload=_event_payload(experience, helpful=helpful, note=note[:500]),
        )
    return experience


# --- promotion ------------------------------------------------------------------------------------


def experiences_promote(
    *,
    tenant: Tenant,
    user_id: str,
    kind: str,
    key: str,
    content: str,
    source: Any = None,
    session: Session | None = None,
    confidence: float = 0.9,
) -> CreateResult:
    """Promote a user preference, project configuration or constraint to long-term memory.

    User-scoped when `user_id` is given, tenant-wide otherwise. Idempotent for the same content
    (outcome "unchanged": confidence nudged up, provenance appended only for a new source); a new
    content for the same (user, kind, key) supersedes the old value (outcome "created", the old
    one kept and linked). Raises InvalidInput for another kind or an empty key / content.
    """
    if kind not in PROMOTABLE_KINDS:
        raise InvalidInput(
            f"kind must be one of {', '.join(sorted(PROMOTABLE_KINDS))}.",
            details={"fields": {"kind": ["Not promotable."]}},
        )
    key, content = key.strip(), content.strip()
    if not key or not content:
        field = "key" if not key else "content"
        raise InvalidInput(f"{field} must not be empty.", details={"fields": {field: ["Required."]}})
    scope = ExperienceScope.USER if user_id else ExperienceScope.TENANT
    with transaction.atomic():
        current = (
            Experience.objects.select_for_update()
            .filter(tenant=tenant, kind=kind, user_id=user_id, scope=scope, key=key)
            .filter(visible_filter())
            .order_by("-created_at")
            .first()
        )
        if current is not None and current.solution == content:
            entry = _provenance_entry(
                method=ExtractionMethod.PROMOTED, task=None, session=session, source=source
            )
            known = any(
                p.get("source") == source and p.get("session") == entry.get("session")
                for p in current.provenance
            )
            if not known:
                current.provenance = [*current.provenance, entry]
            current.confidence = _boosted_confidence(current.confidence, 0.2)
            current.updated_at = timezone.now()
            current.save(update_fields=["provenance", "confidence", "updated_at"])
            return CreateResult(current, "unchanged")
        return experience_create(
            tenant=tenant,
            problem=f"{KIND_LABELS[ExperienceKind(kind)]}: {key}",
            solution=content,
            confidence=confidence,
            extraction_method=ExtractionMethod.PROMOTED,
            user_id=user_id,
            scope=scope,
            kind=kind,
            key=key,
            source_session=session,
            source=source,
            supersedes=current,
        )


# --- capacity -------------------------------------------------------------------------------------


def experiences_evict(*, tenant: Tenant) -> int:
    """Delete the tenant's experiences beyond policy.capacity, least recently USED first.

    Hidden rows (merged, superseded) go before visible ones; among equals, the oldest last use
    (or creation, if never used) goes first. Records one `retention.evicted` event. Idempotent.
    """
    capacity = ExperiencePolicy.for_tenant(tenant).capacity
    with transaction.atomic():
        # One evictor per tenant at a time: the policy row is the lock.
        ExperiencePolicy.objects.select_for_update().filter(tenant=tenant).first()
        excess = Experience.objects.filter(tenant=tenant).count() - capacity
        if excess <= 0:
            return 0
        victims = list(
            Experience.objects.filter(tenant=tenant)
            .annotate(
                last_use=Coalesce("last_used_at", "created_at"),
                visible=Case(
                    When(Q(merged_into__isnull=False) | Q(superseded_by__isnull=False), then=Value(0)),
                    default=Value(1),
                ),
            )
            .order_by("visible", "last_use", "pk")
            .values_list("pk", "public_id")[:excess]
        )
        ids = [pk for pk, _ in victims]
        # Rows merged into a victim go with it, so no hidden duplicate resurfaces.
        Experience.objects.filter(merged_into_id__in=ids).delete()
        Experience.objects.filter(pk__in=ids).delete()
        recorder.event_append(
            tenant=tenant,
            type="retention.evicted",
            payload={
                "kind": "experience",
                "count": len(ids),
                "capacity": capacity,
                "experiences": [public_id for _, public_id in victims[:100]],
            },
        )
    return len(ids)


def experiences_evict_all() -> int:
    """Run eviction for every tenant over capacity. Returns experiences evicted."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.tenant_id FROM {Experience._meta.db_table} e "
            f"LEFT JOIN {ExperiencePolicy._meta.db_table} p ON p.tenant_id = e.tenant_id "
            "GROUP BY e.tenant_id, p.capacity HAVING count(*) > COALESCE(p.capacity, %s)",
            [ExperiencePolicy._meta.get_field("capacity").default],
        )
        tenant_ids = [row[0] for row in cursor.fetchall()]
    return sum(experiences_evict(tenant=tenant) for tenant in Tenant.objects.filter(pk__in=tenant_ids))
