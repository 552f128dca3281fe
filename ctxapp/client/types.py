"""The shapes the API answers, as TypedDicts (tests/test_client_types.py holds them to the OpenAPI
schema: a field the server adds or drops fails that test until it is added or dropped here)."""

from __future__ import annotations

from typing import Any, TypedDict


class SessionOut(TypedDict):
    id: str
    agent: str
    key: str | None
    user_id: str
    model: str
    metadata: dict[str, Any]
    status: str
    created_at: str
    last_accessed_at: str
    expires_at: str | None
    idle_ttl_seconds: int
    ended_at: str | None
    last_seq: int
    message_count: int
    token_count: int


class MessageOut(TypedDict, total=False):
    seq: int
    role: str
    content: str
    token_count: int
    turn_id: str
    tool_call_id: str
    tool_calls: list[dict[str, Any]]
    event_kind: str
    parent_seq: int | None
    artifact_refs: list[Any]
    metadata: dict[str, Any]
    created_at: str
    name: str
    occurred_at: str


class MemoryScope(TypedDict, total=False):
    """Where a memory search looks: an agent, a user, a session; `sessions` "current" | "all"."""

    agent: str
    user_id: str
    session: str
    sessions: str


class MemoryNeighbour(TypedDict):
    seq: int
    role: str
    speaker: str
    text: str
    occurred_at: str | None


class MemoryHit(TypedDict, total=False):
    kind: str  # message | summary | fact | experience | user_memory
    id: str  # messages: "<session id>:<seq>"
    session: str | None
    seq: int | None
    occurred_at: str | None
    speaker: str
    text: str
    score: float
    similarity: float | None  # raw cosine to the query (None: no vector)
    contributions: dict[str, float]  # dense, lexical, neighbour, session, recency, length
    neighbours: list[MemoryNeighbour]  # only when asked
    sources: list[dict[str, Any]]  # user memories only: the turns ({session, seq}) it was taken from


class MemorySearchOut(TypedDict):
    query: str
    results: list[MemoryHit]
    plan: dict[str, Any]
    warnings: list[str]
    candidates: int


class AppendedMessage(TypedDict):
    seq: int
    token_count: int


class AppendOut(TypedDict):
    session: str
    first_seq: int
    last_seq: int
    messages: list[AppendedMessage]


class TaskOut(TypedDict):
    id: str
    session: str | None
    agent: str | None
    user_id: str
    title: str
    input: str
    output: str
    status: str
    value_tier: str
    metadata: dict[str, Any]
    created_at: str
    updated_at: str
    finished_at: str | None
    expires_at: str | None


class EventOut(TypedDict):
    id: str
    stream: str
    seq: int
    type: str
    session: str | None
    payload: dict[str, Any]
    created_at: str


class ExperienceBulkOut(TypedDict):
    results: list[dict[str, Any]]  # one experience per item, in order, each with `outcome`
    created: int
    merged: int
    unchanged: int


class ExperiencePolicyOut(TypedDict):
    capacity: int
    merge_threshold: float
    merge_token_overlap: float
    supersede_problem_threshold: float
    solution_agreement_threshold: float
    vector_weight: float
    text_weight: float
    context_min_similarity: float
    helpful_weight: float


class DigestItem(TypedDict):
    text: str
    seq: int | None


class DigestOut(TypedDict):
    session: str
    user_id: str
    version: int
    method: str
    error: str
    covers_up_to_seq: int
    created_at: str
    text: str
    goals: list[DigestItem]
    decisions: list[DigestItem]
    findings: list[DigestItem]
    preferences: list[DigestItem]
    constraints: list[DigestItem]
    progress: list[DigestItem]
    open_questions: list[DigestItem]


class DigestPage(TypedDict):
    items: list[DigestOut]
    next: str | None
    results: list[DigestOut]  # deprecated alias of items
    next_cursor: str | None  # deprecated alias of next


class AgentOut(TypedDict):
    name: str
    created_at: str
    session_count: int
    last_active_at: str | None


class Page(TypedDict):
    items: list[Any]
    next: str | None
    next_cursor: str | None  # deprecated alias of next


class MessagePage(TypedDict):
    items: list[MessageOut]
    next: int | None
    next_after: int | None  # deprecated alias of next


class EventPage(TypedDict):
    items: list[EventOut]
    next: int | None
    next_after: int | None  # deprecated alias of next


class ExperienceOut(TypedDict):
    id: str
    problem: str
    cause: str
    solution: str
    text: str
    confidence: float
    extraction_method: str
    kind: str
    key: str
    scope: str
    user_id: str
    agent: str
    aliases: list[str]
    source_task: str | None
    source_session: str | None
    provenance: dict[str, Any]
    embedding: dict[str, Any]  # status, model, dimensions, error, attempts, embedded_at
    use_count: int
    last_used_at: str | None
    helpful_count: int
    unhelpful_count: int
    merge_count: int
    active: bool
    merged_into: str | None
    merged_at: str | None
    superseded_by: str | None
    superseded_at: str | None
    created_at: str
    updated_at: str


class ExperienceDetailOut(ExperienceOut):
    merged_from: list[str]
    supersedes: list[str]


class ExperiencePage(TypedDict):
    items: list[ExperienceOut]
    next: str | None
    results: list[ExperienceOut]  # deprecated alias of items
    next_cursor: str | None  # deprecated alias of next


class _CheckpointState(TypedDict, total=False):
    state: dict[str, Any]  # only on checkpoint_get


class CheckpointOut(_CheckpointState):
    id: str
    agent: str
    seq: int
    reason: str
    step: int | None
    produced_by: str
    covers_event_seq: int
    schema_version: int
    storage: str  # full | delta
    base_seq: int | None
    state_bytes: int
    state_sha256: str
    created_at: str


class CheckpointPage(TypedDict):
    items: list[CheckpointOut]
    next: str | None
    next_cursor: str | None  # deprecated alias of next


class ForgetReceiptOut(TypedDict):
    user_id: str
    counts: dict[str, int]  # rows erased per kind; all zero when the user was already forgotten


class RedactReceiptOut(TypedDict):
    session: str
    seq: int
    counts: dict[str, int]  # what changed per kind


class UserMemorySource(TypedDict):
    session: str
    seq: int


class UserMemoryOut(TypedDict):
    """One memory about a user; `current` until a new value of its `subject` supersedes it."""

    id: str
    user_id: str
    subject: str
    type: str
    text: str
    sources: list[UserMemorySource]
    confidence: float
    origin: str
    agent: str
    current: bool
    valid_from: str
    valid_to: str | None
    superseded_by: str | None
    embedding_status: str
    created_at: str
    updated_at: str


class UserMemoryWrittenOut(UserMemoryOut):
    outcome: str  # created | superseded | unchanged
    supersedes: str | None


class UserMemoryPage(TypedDict):
    items: list[UserMemoryOut]
    next: str | None
    next_cursor: str | None  # deprecated alias of next


class UserMemoryHistoryOut(TypedDict):
    items: list[UserMemoryOut]


class UserMemoryDeletedOut(TypedDict):
    deleted: list[str]
    count: int
