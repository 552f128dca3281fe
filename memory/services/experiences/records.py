"""The pieces every write of an experience shares: its input, normalised draft, new row,
provenance entry, event payload and the exact-duplicate merge. Nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from memory.models import Experience, ExperienceKind, ExperienceScope, Session, Task, Tenant
from memory.services.embedding import text_hash

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
    ExperienceKind.FACT: "Fact",
}
# What an exact duplicate changes on the row it merges into (saved with update_fields).
EXACT_MERGE_FIELDS = ["confidence", "use_count", "merge_count", "provenance", "updated_at"]


@dataclass(frozen=True)
class CreateResult:
    experience: Experience
    outcome: str  # "created" | "merged" | "unchanged"


@dataclass(frozen=True)
class BulkItem:
    """One experience to create (the API's validated item; experience_create builds one too)."""

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


@dataclass(frozen=True)
class Draft:
    """A BulkItem ready to write: texts stripped, scope decided, text hash computed."""

    item: BulkItem
    problem: str
    cause: str
    solution: str
    scope: str
    digest: str

    @property
    def identity(self) -> tuple[str, str, str, str, str]:
        """What makes two experiences exact duplicates: text, kind, scope, user and agent."""
        return (self.digest, self.item.kind, self.scope, self.item.user_id, self.item.agent)


def draft_of(item: BulkItem) -> Draft:
    """`item` normalised: stripped texts, scope `user` when it names a user (else `tenant`)."""
    problem, cause, solution = item.problem.strip(), item.cause.strip(), item.solution.strip()
    scope = item.scope or (ExperienceScope.USER if item.user_id else ExperienceScope.TENANT)
    digest = text_hash(Experience.compose_text(problem, cause, solution, item.kind))
    return Draft(item=item, problem=problem, cause=cause, solution=solution, scope=scope, digest=digest)


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


def provenance_entry(
    *,
    method: str,
    task: Task | None,
    session: Session | None,
    message_seqs: list[int] | None = None,
    source: Any = None,
) -> dict[str, Any]:
    """One provenance record: how, when, and from which task, session, messages or source."""
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


def boosted_confidence(current: float, incoming: float) -> float:
    """Agreement raises confidence toward 1, never past it (a damped noisy-OR)."""
    return round(min(1.0, 1.0 - (1.0 - current) * (1.0 - 0.5 * incoming)), 4)


def event_payload(experience: Experience, **extra: Any) -> dict[str, Any]:
    """The payload of an `experience.*` event: id, method, kind, source task, and `extra`."""
    return {
        "experience": experience.public_id,
        "extraction_method": experience.extraction_method,
        "kind": experience.kind,
        **({"task": experience.source_task.public_id} if experience.source_task_id else {}),  # type: ignore[union-attr]
        **extra,
    }


def created_payload(experience: Experience, **extra: Any) -> dict[str, Any]:
    """The payload of `experience.created` (agent and `merge: false` only when given)."""
    return event_payload(
        experience,
        embedding_status=experience.embedding_status,
        **extra,
        **({"agent": experience.agent} if experience.agent else {}),
        **({} if experience.mergeable else {"merge": False}),
    )


def row_new(
    *,
    tenant: Tenant,
    draft: Draft,
    extraction_method: str,
    source_task: Task | None,
    source_session: Session | None,
    entry: dict[str, Any],
) -> Experience:
    """The unsaved row of `draft`, `pending`, with `entry` as its first provenance."""
    item = draft.item
    return Experience(
        tenant=tenant, user_id=item.user_id, scope=draft.scope, kind=item.kind, key=item.key,
        problem=draft.problem, cause=draft.cause, solution=draft.solution, confidence=item.confidence,
        extraction_method=extraction_method, source_task=source_task, source_session=source_session,
        provenance=[entry], text_hash=draft.digest, agent=item.agent, mergeable=item.merge,
    )  # fmt: skip


def same_source(target: Experience, entry: dict[str, Any]) -> bool:
    """Whether `target` already came from `entry`'s task by the same method (a re-run: no-op)."""
    return "task" in entry and any(
        p.get("method") == entry["method"] and p.get("task") == entry["task"] for p in target.provenance
    )


def exact_merge_apply(target: Experience, *, confidence: float, entry: dict[str, Any]) -> None:
    """Fold an exact duplicate (its `confidence`, its provenance `entry`) into `target`, unsaved.

    The caller saves EXACT_MERGE_FIELDS.
    """
    target.confidence = boosted_confidence(target.confidence, confidence)
    target.use_count += 1
    target.merge_count += 1
    target.provenance = [*target.provenance, {**entry, "merge": "exact"}]
    target.updated_at = timezone.now()
