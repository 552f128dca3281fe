"""The shapes the API answers, as TypedDicts (tests/test_client_types.py holds them to the OpenAPI
schema: a field the server adds or drops fails that test until it is added or dropped here)."""

from __future__ import annotations

from typing import Any, TypedDict


class SessionOut(TypedDict):
    id: str
    agent: str
    user_id: str
    model: str
    metadata: dict[str, Any]
    status: str
    created_at: str
    last_accessed_at: str
    expires_at: str | None
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
    kind: str  # message | summary | fact | experience
    id: str  # messages: "<session id>:<seq>"
    session: str | None
    seq: int | None
    occurred_at: str | None
    speaker: str
    text: str
    score: float
    contributions: dict[str, float]  # dense, lexical, neighbour, recency
    neighbours: list[MemoryNeighbour]  # only when asked


class MemorySearchOut(TypedDict):
    query: str
    results: list[MemoryHit]
    plan: dict[str, Any]
    warnings: list[str]
    candidates: int


class AppendOut(TypedDict):
    session: str
    first_seq: int
    last_seq: int
    messages: list[MessageOut]


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
    results: list[DigestOut]
    next_cursor: str | None


class Page(TypedDict):
    items: list[Any]
    next_cursor: str | None


class MessagePage(TypedDict):
    items: list[MessageOut]
    next_after: int | None


class EventPage(TypedDict):
    items: list[EventOut]
    next_after: int | None
