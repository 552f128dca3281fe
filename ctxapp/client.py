"""The Python client of the ctxapp REST API (sync `Client` and async `AsyncClient`, on httpx).

    from ctxapp.client import Client

    with Client("http://127.0.0.1:8000", api_key="ctx_…") as ctx:
        session = ctx.session_create(agent="support-bot", user_id="u-42", model="gpt-4o")
        ctx.message_append(session["id"], role="user", content="My invoice is wrong.")
        print(ctx.messages_list(session["id"])["items"])

Every write carries an `Idempotency-Key` (generated when the caller gives none) and a retry
reuses it, so a network failure or a 5xx never writes twice. Errors come back as exceptions
chosen by the API's error `code` (`NotFound`, `SessionEnded`, …), all subclasses of
`CtxappError` with `.code`, `.status`, `.message` and `.details`.

This module must stay importable without Django: it imports nothing from ctxapp's server side.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, TypedDict

import httpx

__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "CtxappError",
    "Forbidden",
    "IdempotencyConflict",
    "IdempotencyInProgress",
    "NetworkError",
    "NotFound",
    "PayloadTooLarge",
    "PromptTooLong",
    "RateLimited",
    "ServerError",
    "SessionEnded",
    "TaskFinished",
    "Unauthorized",
    "ValidationFailed",
]

API_PREFIX = "/api/v1"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})
DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRIES = 3
BACKOFF_BASE = 0.1  # seconds; doubles per attempt, with full jitter
BACKOFF_MAX = 5.0


# --- errors -----------------------------------------------------------------------------------


class CtxappError(Exception):
    """An error answered by the API (or a transport failure after all retries).

    `code` is the API's stable error code (`not_found`, `session_ended`, …), `status` the HTTP
    status (0 for a network failure), `details` the error's details object.
    """

    def __init__(
        self, message: str, *, code: str = "error", status: int = 0, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details = details or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, message={self.message!r})"


class NetworkError(CtxappError):
    """The server could not be reached or did not answer (after all retries)."""


class Unauthorized(CtxappError):
    """Missing, unknown, revoked or expired API key (401)."""


class Forbidden(CtxappError):
    """The key lacks a scope this request needs (403)."""


class NotFound(CtxappError):
    """No such object for this tenant (404). Another tenant's id answers the same."""


class ValidationFailed(CtxappError):
    """The request was refused as invalid (400/422); `details["fields"]` names the fields."""


class Conflict(CtxappError):
    """The request conflicts with the current state (409)."""


class SessionEnded(Conflict):
    """The session is ended, expired or evicted; start a new one."""


class IdempotencyConflict(Conflict):
    """The Idempotency-Key was already used with a different request."""


class IdempotencyInProgress(Conflict):
    """A request with this Idempotency-Key is still running (retried automatically)."""


class TaskFinished(Conflict):
    """The task already succeeded or failed; it is final."""


class PayloadTooLarge(CtxappError):
    """The request body or a field is over its size limit (413)."""


class PromptTooLong(CtxappError):
    """Even the minimal context does not fit the model's budget (422)."""


class RateLimited(CtxappError):
    """Too many requests (429)."""


class ServerError(CtxappError):
    """The server failed (5xx) and retries did not help."""


# Error code → exception class. Owners of other capabilities add their codes here.
ERROR_CODES: dict[str, type[CtxappError]] = {
    "unauthenticated": Unauthorized,
    "invalid_api_key": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "no_session": NotFound,
    "validation_error": ValidationFailed,
    "invalid_json": ValidationFailed,
    "unsupported_media_type": ValidationFailed,
    "conflict": Conflict,
    "session_ended": SessionEnded,
    "idempotency_conflict": IdempotencyConflict,
    "idempotency_in_progress": IdempotencyInProgress,
    "task_finished": TaskFinished,
    "invalid_transition": Conflict,
    "payload_too_large": PayloadTooLarge,
    "prompt_too_long": PromptTooLong,
    "rate_limited": RateLimited,
    "internal_error": ServerError,
    # cognition
    "invalid_state": ValidationFailed,
    "schema_version_unsupported": ValidationFailed,
    "version_conflict": Conflict,
    "agent_mismatch": Forbidden,
    "checkpoint_corrupt": ServerError,
}

STATUS_FALLBACK: dict[int, type[CtxappError]] = {
    400: ValidationFailed,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: RateLimited,
}


def error_from_response(response: httpx.Response) -> CtxappError:
    """The exception for an error response, chosen by its `error.code`, else by its status."""
    code, message = "", ""
    details: Any = {}
    try:
        body = response.json()
        error = body.get("error", {}) if isinstance(body, dict) else {}
        code = str(error.get("code") or "")
        message = str(error.get("message") or "")
        details = error.get("details") or {}
    except ValueError:
        message = response.text[:500]
    klass = ERROR_CODES.get(code) or STATUS_FALLBACK.get(response.status_code)
    if klass is None:
        klass = ServerError if response.status_code >= 500 else CtxappError
    return klass(
        message or f"HTTP {response.status_code}",
        code=code or f"http_{response.status_code}",
        status=response.status_code,
        details=details if isinstance(details, dict) else {"detail": details},
    )


# --- response shapes (what the API returns) --------------------------------------------------


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


def _drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _message_body(role: str, content: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    return _drop_none({"role": role, "content": content, **fields})


# --- the shared part of both clients ---------------------------------------------------------


class _Base:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retries = max(0, retries)

    def _url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        if not path.startswith("/api/"):
            path = API_PREFIX + (path if path.startswith("/") else "/" + path)
        return self.base_url + path

    def _headers(self, method: str, idempotency_key: str | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}
        if method.upper() in WRITE_METHODS:
            headers["Idempotency-Key"] = idempotency_key or uuid.uuid4().hex
        return headers

    def _backoff(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None and response.headers.get("Retry-After", "").isdigit():
            return min(float(response.headers["Retry-After"]), BACKOFF_MAX)
        return random.uniform(0, min(BACKOFF_MAX, BACKOFF_BASE * (2**attempt)))

    @staticmethod
    def _should_retry(response: httpx.Response) -> bool:
        if response.status_code in RETRYABLE_STATUSES:
            return True
        if response.status_code == 409:
            try:
                return response.json()["error"]["code"] == "idempotency_in_progress"
            except (ValueError, KeyError, TypeError):
                return False
        return False

    @staticmethod
    def _result(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise error_from_response(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()


class Client(_Base):
    """Synchronous client. Thread-safe (one httpx.Client, one connection pool).

    `transport` lets tests and callers swap the httpx transport (e.g. to inject faults).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, retries=retries)
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Send one API request; return the decoded JSON body (None for an empty body).

        Writes get an Idempotency-Key (this one, or a new one) that every retry reuses. Retries
        network failures, 429, 5xx and `idempotency_in_progress` up to `retries` times with
        exponential backoff; raises the CtxappError subclass matching the error code.
        """
        method = method.upper()
        headers = self._headers(method, idempotency_key)
        url = self._url(path)
        query = _drop_none(params or {})
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, url, json=json, params=query, headers=headers)
            except httpx.TransportError as exc:
                if last:
                    raise NetworkError(f"{method} {url} failed: {exc}", code="network_error") from exc
                time.sleep(self._backoff(attempt, None))
                continue
            if not last and self._should_retry(response):
                time.sleep(self._backoff(attempt, response))
                continue
            return self._result(response)
        raise AssertionError("unreachable")  # pragma: no cover

    # --- sessions ---------------------------------------------------------------------------
    def session_create(
        self,
        agent: str,
        *,
        user_id: str | None = None,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: int | None = None,
        idempotency_key: str | None = None,
    ) -> SessionOut:
        body = _drop_none(
            {
                "agent": agent,
                "user_id": user_id,
                "model": model,
                "metadata": metadata,
                "ttl_seconds": ttl_seconds,
            }
        )
        return self.request("POST", "/sessions", json=body, idempotency_key=idempotency_key)

    def session_get(self, session_id: str) -> SessionOut:
        return self.request("GET", f"/sessions/{session_id}")

    def sessions_list(
        self,
        *,
        agent: str | None = None,
        user_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page:
        params = {"agent": agent, "user_id": user_id, "status": status, "cursor": cursor, "limit": limit}
        return self.request("GET", "/sessions", params=params)

    def sessions_iter(self, **filters: Any) -> Iterator[SessionOut]:
        """Every session matching the filters, newest first, following the cursor."""
        cursor = None
        while True:
            page = self.sessions_list(cursor=cursor, **filters)
            yield from page["items"]
            cursor = page["next_cursor"]
            if not cursor:
                return

    def session_end(self, session_id: str, *, idempotency_key: str | None = None) -> SessionOut:
        return self.request("POST", f"/sessions/{session_id}/end", idempotency_key=idempotency_key)

    def session_delete(self, session_id: str, *, idempotency_key: str | None = None) -> None:
        self.request("DELETE", f"/sessions/{session_id}", idempotency_key=idempotency_key)

    def agent_latest_session(self, agent: str) -> SessionOut:
        """The agent's most recently created session; NotFound (code `no_session`) when none."""
        return self.request("GET", f"/agents/{agent}/latest-session")

    # --- messages ---------------------------------------------------------------------------
    def message_append(
        self,
        session_id: str,
        *,
        role: str,
        content: str = "",
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> MessageOut:
        """Append one message (fields: turn_id, tool_call_id, tool_calls, event_kind, parent_seq,
        artifact_refs, metadata). Returns it with its seq and token count."""
        body = _message_body(role, content, fields)
        return self.request(
            "POST", f"/sessions/{session_id}/messages", json=body, idempotency_key=idempotency_key
        )

    def messages_append(
        self, session_id: str, messages: list[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> AppendOut:
        """Append a batch, all or nothing (the server's limit is CTXAPP_BATCH_MAX_MESSAGES)."""
        return self.request(
            "POST",
            f"/sessions/{session_id}/messages",
            json={"messages": messages},
            idempotency_key=idempotency_key,
        )

    def messages_list(
        self, session_id: str, *, after: int | None = None, limit: int | None = None
    ) -> MessagePage:
        """Messages with seq > after, oldest first; pass `next_after` back for the next page."""
        return self.request(
            "GET", f"/sessions/{session_id}/messages", params={"after": after, "limit": limit}
        )

    def messages_iter(self, session_id: str, *, after: int = 0) -> Iterator[MessageOut]:
        while True:
            page = self.messages_list(session_id, after=after)
            yield from page["items"]
            if page["next_after"] is None:
                return
            after = page["next_after"]

    # --- memory search ----------------------------------------------------------------------
    def memory_search(
        self,
        query: str,
        *,
        scope: MemoryScope | Mapping[str, Any] | None = None,
        kinds: list[str] | None = None,
        limit: int | None = None,
        time_range: Mapping[str, str] | None = None,
        plan: Mapping[str, Any] | None = None,
        neighbours: int | None = None,
    ) -> MemorySearchOut:
        """Search conversational memory (messages, summaries, facts, experiences) of a scope.

        scope: {agent, user_id, session, sessions: "current" | "all"}; time_range: {from, to} (ISO).
        """
        body = _drop_none(
            {"query": query, "scope": dict(scope) if scope is not None else None, "kinds": kinds,
             "limit": limit, "time_range": dict(time_range) if time_range is not None else None,
             "plan": dict(plan) if plan is not None else None, "neighbours": neighbours}
        )  # fmt: skip
        return self.request("POST", "/memory/search", json=body)

    def memory_index_status(self) -> dict[str, int]:
        """The tenant's messages per embedding status: {pending, completed, failed, skipped}."""
        return self.request("GET", "/memory/index")

    # --- tasks ------------------------------------------------------------------------------
    def task_create(
        self,
        *,
        session: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        title: str | None = None,
        input: str | None = None,
        value_tier: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TaskOut:
        body = _drop_none(
            {
                "session": session,
                "agent": agent,
                "user_id": user_id,
                "title": title,
                "input": input,
                "value_tier": value_tier,
                "metadata": metadata,
            }
        )
        return self.request("POST", "/tasks", json=body, idempotency_key=idempotency_key)

    def tasks_list(
        self,
        *,
        session: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page:
        params = {
            "session": session,
            "agent": agent,
            "user_id": user_id,
            "status": status,
            "cursor": cursor,
            "limit": limit,
        }
        return self.request("GET", "/tasks", params=params)

    def task_get(self, task_id: str) -> TaskOut:
        return self.request("GET", f"/tasks/{task_id}")

    def task_update(
        self,
        task_id: str,
        *,
        status: str | None = None,
        output: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TaskOut:
        body = _drop_none({"status": status, "output": output, "metadata": metadata})
        return self.request("PATCH", f"/tasks/{task_id}", json=body, idempotency_key=idempotency_key)

    # --- events (flight recorder) -----------------------------------------------------------
    def events_list(
        self,
        agent: str,
        *,
        after: int | None = None,
        limit: int | None = None,
        type: str | None = None,
        session: str | None = None,
    ) -> EventPage:
        """The agent's events with seq > after, oldest first; `type` filters (`message.added`, `agent.*`)."""
        return self.request(
            "GET",
            f"/agents/{agent}/events",
            params={"after": after, "limit": limit, "type": type, "session": session},
        )

    def events_iter(self, agent: str, *, after: int = 0, type: str | None = None) -> Iterator[EventOut]:
        while True:
            page = self.events_list(agent, after=after, type=type)
            yield from page["items"]
            if page["next_after"] is None:
                return
            after = page["next_after"]

    def event_emit(
        self,
        agent: str,
        type: str,
        payload: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
    ) -> EventOut:
        """Record an agent-emitted event (type must start with `agent.`)."""
        body = _drop_none({"type": type, "payload": payload or {}, "session": session})
        return self.request("POST", f"/agents/{agent}/events", json=body, idempotency_key=idempotency_key)

    # --- context engine ---
    def context_build(
        self,
        session_id: str,
        input: str = "",
        *,
        model: str | None = None,
        system_parts: Mapping[str, str] | list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        open_questions: list[str] | None = None,
        next_actions: list[str] | None = None,
        budget: Mapping[str, Any] | None = None,
        mode: str | None = None,
        recall: Mapping[str, Any] | None = None,
        query: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """The next prompt for the session: messages, tools, manifest, budget, warnings, forecast.

        `recall` overrides the recall policy for this build (enabled, top_k, min_score, position,
        budget_share); `query` is what to recall for (default: the input).
        Raises PromptTooLong (its `details` carry the numbers) when even the minimal context does not fit."""
        body = _drop_none(
            {
                "input": input,
                "model": model,
                "system_parts": system_parts,
                "tools": tools,
                "open_questions": open_questions,
                "next_actions": next_actions,
                "budget": dict(budget) if budget else None,
                "mode": mode,
                "recall": dict(recall) if recall is not None else None,
                "query": query,
            }
        )
        return self.request(
            "POST", f"/sessions/{session_id}/context", json=body, idempotency_key=idempotency_key
        )

    def context_builds(self, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The session's latest builds (budget samples with their manifests), newest first."""
        return self.request("GET", f"/sessions/{session_id}/context", params={"limit": limit})["builds"]

    def usage_report(
        self,
        session_id: str,
        *,
        input_tokens: int,
        output_tokens: int | None = None,
        cached_input_tokens: int | None = None,
        reasoning_tokens: int | None = None,
        build_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Report the provider's usage for a build (default: the latest); calibrates later estimates."""
        body = _drop_none(
            {
                "build_id": build_id,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                "gen_ai.usage.cache_read.input_tokens": cached_input_tokens,
                "gen_ai.usage.reasoning.output_tokens": reasoning_tokens,
            }
        )
        return self.request(
            "POST", f"/sessions/{session_id}/usage", json=body, idempotency_key=idempotency_key
        )

    def tokens_count(
        self,
        *,
        text: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        model: str = "gpt-4o",
    ) -> dict[str, Any]:
        """Count a text or a chat prompt for a model (exact for OpenAI encodings, else estimated)."""
        body = _drop_none({"text": text, "messages": messages, "tools": tools, "model": model})
        return self.request("POST", "/tokens/count", json=body)

    def models_list(self, *, provider: str | None = None) -> list[dict[str, Any]]:
        """Model profiles: built-in and the tenant's own."""
        return self.request("GET", "/models", params={"provider": provider})["models"]

    def model_get(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/models/{name}")

    def context_policy_get(self, session_id: str) -> dict[str, Any]:
        return self.request("GET", f"/sessions/{session_id}/context-policy")

    def context_policy_set(self, session_id: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the session's context policy overrides (history_window, output_reserve, …)."""
        return self.request(
            "PUT", f"/sessions/{session_id}/context-policy", json={"overrides": dict(overrides)}
        )

    def summaries_list(self, session_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/sessions/{session_id}/summaries")["summaries"]

    def summarise_now(self, session_id: str) -> dict[str, Any]:
        """Queue summarisation of the session (202)."""
        return self.request("POST", f"/sessions/{session_id}/summaries")

    def session_digest(self, session_id: str, *, version: int | None = None) -> DigestOut:
        """The session's digest (goals, decisions, findings, preferences, constraints, progress,
        open questions): the latest, or `version`. NotFound while it has none."""
        return self.request("GET", f"/sessions/{session_id}/digest", params={"version": version})

    def session_digests(
        self, session_id: str, *, cursor: str | None = None, limit: int | None = None
    ) -> DigestPage:
        """A page of the session's digest versions, newest first."""
        return self.request(
            "GET", f"/sessions/{session_id}/digests", params={"cursor": cursor, "limit": limit}
        )

    def session_digest_refresh(self, session_id: str) -> dict[str, Any]:
        """Queue an update of the session's digest now (202)."""
        return self.request("POST", f"/sessions/{session_id}/digest")

    # --- experiences ---
    def experience_create(
        self,
        problem: str,
        *,
        solution: str = "",
        cause: str = "",
        confidence: float | None = None,
        user_id: str | None = None,
        scope: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        task: str | None = None,
        supersedes: str | None = None,
        agent: str | None = None,
        merge: bool | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Store an experience (embedded asynchronously). `outcome` is created, or merged for an
        exact duplicate (`merge=False`: always a new row); `supersedes` hides that older
        experience behind this one; `agent` records which agent learnt it."""
        body = _drop_none(
            {"problem": problem, "solution": solution, "cause": cause, "confidence": confidence,
             "user_id": user_id, "scope": scope, "kind": kind, "key": key, "task": task,
             "supersedes": supersedes, "agent": agent, "merge": merge}
        )  # fmt: skip
        return self.request("POST", "/experiences", json=body, idempotency_key=idempotency_key)

    def experiences_create_bulk(
        self, items: list[Mapping[str, Any]], *, task: str | None = None, idempotency_key: str | None = None
    ) -> ExperienceBulkOut:
        """Create up to 1,000 experiences in one call, all or nothing (each item like
        experience_create's arguments: problem, solution, cause, confidence, user_id, scope, kind,
        key, agent, merge). Their embeddings are queued in batches."""
        body = _drop_none({"items": [dict(item) for item in items], "task": task})
        return self.request("POST", "/experiences/bulk", json=body, idempotency_key=idempotency_key)

    def experience_delete(self, experience_id: str, *, idempotency_key: str | None = None) -> None:
        """Delete an experience (its hidden merged duplicates too; what it superseded comes back)."""
        self.request("DELETE", f"/experiences/{experience_id}", idempotency_key=idempotency_key)

    def experience_policy_get(self) -> ExperiencePolicyOut:
        """The tenant's experience policy: capacity, merge rule, search weights (admin key)."""
        return self.request("GET", "/tenant/policies/experiences")

    def experience_policy_update(self, **changes: Any) -> ExperiencePolicyOut:
        """Change some experience policy fields, e.g. `capacity=20_000` (admin key)."""
        return self.request("PATCH", "/tenant/policies/experiences", json=changes)

    def experience_get(self, experience_id: str) -> dict[str, Any]:
        """One experience with provenance, merge and supersede links and embedding status."""
        return self.request("GET", f"/experiences/{experience_id}")

    def experiences_list(
        self, *, cursor: str | None = None, limit: int | None = None, **filters: Any
    ) -> dict[str, Any]:
        """A page {results, next_cursor}; filters: user_id, kind, embedding_status, extraction_method,
        include_superseded, as_of (ISO time), agent."""
        return self.request("GET", "/experiences", params={"cursor": cursor, "limit": limit, **filters})

    def experiences_search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        limit: int | None = None,
        sources: list[str] | None = None,
        weights: Mapping[str, float] | None = None,
        fusion: str | None = None,
        include_superseded: bool | None = None,
        as_of: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
    ) -> dict[str, Any]:
        """Hybrid search: {results: [{experience, score, similarity, text_score, contributions}], plan,
        warnings}. `agent`: only experiences that agent recorded."""
        body = _drop_none(
            {"query": query, "user_id": user_id, "limit": limit, "sources": sources,
             "weights": dict(weights) if weights is not None else None, "fusion": fusion,
             "include_superseded": include_superseded, "as_of": as_of, "kind": kind, "agent": agent}
        )  # fmt: skip
        return self.request("POST", "/experiences/search", json=body)

    def experience_feedback(
        self, experience_id: str, *, helpful: bool, note: str = "", session: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Report whether an experience helped; ranking takes it into account."""
        body = _drop_none({"helpful": helpful, "note": note, "session": session})
        return self.request(
            "POST", f"/experiences/{experience_id}/feedback", json=body, idempotency_key=idempotency_key
        )

    def experience_promote(
        self, kind: str, key: str, content: str, *, user_id: str | None = None, session: str | None = None,
        source: Any = None, idempotency_key: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Promote a preference / project_config / constraint to long-term (user-scoped) memory."""
        body = _drop_none(
            {"kind": kind, "key": key, "content": content, "user_id": user_id, "session": session,
             "source": source}
        )  # fmt: skip
        return self.request("POST", "/experiences/promote", json=body, idempotency_key=idempotency_key)

    def experiences_retry_embeddings(self, experience_ids: list[str] | None = None) -> dict[str, Any]:
        """Re-queue failed embeddings (all of the tenant's, or these): {requeued}."""
        body = _drop_none({"experiences": experience_ids})
        return self.request("POST", "/experiences/embeddings/retry", json=body)

    def task_distill(self, task_id: str, *, mode: str = "full") -> dict[str, Any]:
        """Distil a finished task: light (now, returns the experiences) or full (queued)."""
        return self.request("POST", f"/tasks/{task_id}/distill", json={"mode": mode})

    # --- cognition ---
    # The calling agent of private context, messages and context views is `as_agent`
    # (the API also takes it as the X-Agent-Id header).
    def state_get(self, agent: str) -> dict[str, Any]:
        """The agent's cognitive state (schema 1; version 0 and empty if never written)."""
        return self.request("GET", f"/agents/{agent}/state")

    def state_put(
        self,
        agent: str,
        state: dict[str, Any],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Replace the agent's cognitive state; `expected_version` → Conflict if it changed meanwhile."""
        return self.request(
            "PUT",
            f"/agents/{agent}/state",
            json=state,
            params={"expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    def state_patch(
        self,
        agent: str,
        patch: list[dict[str, Any]],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Change the agent's cognitive state by a JSON Patch (RFC 6902; paths relative to the state).

        A patch that does not apply → ValidationFailed (422 `invalid_patch`); nothing is stored."""
        return self.request(
            "PATCH",
            f"/agents/{agent}/state",
            json={"patch": patch},
            params={"expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    def state_restore(
        self,
        agent: str,
        checkpoint: str | int,
        *,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Make a checkpoint's state current again (a new state version and a new checkpoint)."""
        body = _drop_none({"checkpoint": str(checkpoint), "reason": reason})
        return self.request(
            "POST", f"/agents/{agent}/state/restore", json=body, idempotency_key=idempotency_key
        )

    def checkpoint_create(
        self,
        agent: str,
        *,
        reason: str | None = None,
        step: int | None = None,
        produced_by: str | None = None,
        state: dict[str, Any] | None = None,
        patch: list[dict[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Checkpoint the agent's state (writing `state`, or applying the JSON Patch `patch`, first)."""
        body = _drop_none(
            {"reason": reason, "step": step, "produced_by": produced_by, "state": state, "patch": patch}
        )
        return self.request(
            "POST", f"/agents/{agent}/checkpoints", json=body, idempotency_key=idempotency_key
        )

    def checkpoints_list(self, agent: str, *, cursor: str | None = None, limit: int | None = None) -> Page:
        return self.request("GET", f"/agents/{agent}/checkpoints", params={"cursor": cursor, "limit": limit})

    def checkpoint_get(self, agent: str, ref: str | int) -> dict[str, Any]:
        """One checkpoint by seq or id, with the state it recorded."""
        return self.request("GET", f"/agents/{agent}/checkpoints/{ref}")

    def checkpoint_diff(self, agent: str, source: str | int, target: str | int) -> dict[str, Any]:
        """What changed between two checkpoints, one entry per JSON path."""
        return self.request(
            "GET", f"/agents/{agent}/checkpoints/diff", params={"from": str(source), "to": str(target)}
        )

    def recovered_state(self, agent: str, *, as_agent: str | None = None) -> dict[str, Any]:
        """Everything to resume after a crash; private context and inbox only with as_agent=agent."""
        return self.request("GET", f"/agents/{agent}/recovered-state", params={"as_agent": as_agent})

    def reducers_get(self, agent: str) -> dict[str, Any]:
        return self.request("GET", f"/agents/{agent}/reducers")

    def reducers_put(
        self, agent: str, reducers: list[dict[str, str]], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Declare how `agent.*` events fold: [{event_type, op: set|merge|append, target, source}]."""
        return self.request(
            "PUT", f"/agents/{agent}/reducers", json={"reducers": reducers}, idempotency_key=idempotency_key
        )

    def context_view(self, agent: str, task: str) -> dict[str, Any]:
        """The agent's view of a task: shared context, its private context, its inbox."""
        return self.request("GET", f"/agents/{agent}/context-view", params={"task": task, "as_agent": agent})

    def shared_context_get(self, task: str) -> dict[str, Any]:
        return self.request("GET", f"/tasks/{task}/shared-context")

    def shared_context_put(
        self,
        task: str,
        *,
        as_agent: str | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Replace the shared context (fields: goal, constraints, artifacts, decisions, dependencies)."""
        return self.request(
            "PUT",
            f"/tasks/{task}/shared-context",
            json=fields,
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    def shared_context_patch(
        self,
        task: str,
        *,
        as_agent: str | None = None,
        append: dict[str, list[Any]] | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Change some shared-context fields, and/or append items to its lists."""
        body = _drop_none({**fields, "append": append})
        return self.request(
            "PATCH",
            f"/tasks/{task}/shared-context",
            json=body,
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    def private_context_get(self, task: str, *, as_agent: str) -> dict[str, Any]:
        return self.request("GET", f"/tasks/{task}/private-context", params={"as_agent": as_agent})

    def private_context_put(
        self,
        task: str,
        data: dict[str, Any],
        *,
        as_agent: str,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        return self.request(
            "PUT",
            f"/tasks/{task}/private-context",
            json={"data": data},
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    def task_message_send(
        self,
        task: str,
        body: Any,
        *,
        as_agent: str,
        to: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Send a message on the task to `to` (None = broadcast)."""
        return self.request(
            "POST",
            f"/tasks/{task}/messages",
            json={"to": to, "body": body},
            params={"as_agent": as_agent},
            idempotency_key=idempotency_key,
        )

    def task_messages_list(
        self,
        task: str,
        *,
        as_agent: str,
        box: str | None = None,
        unread: bool | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page:
        params = {"as_agent": as_agent, "box": box, "unread": unread, "cursor": cursor, "limit": limit}
        return self.request("GET", f"/tasks/{task}/messages", params=params)

    def task_messages_mark_read(
        self, task: str, *, as_agent: str, ids: list[str] | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return self.request(
            "POST",
            f"/tasks/{task}/messages/read",
            json={"ids": ids},
            params={"as_agent": as_agent},
            idempotency_key=idempotency_key,
        )

    # --- decay ---
    def fact_register(
        self,
        session_id: str,
        *,
        key: str,
        type: str,
        content: str,
        scope: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Track a fact of the session (or update the one with this key). Importance comes from `type`."""
        body = _drop_none({"key": key, "type": type, "content": content, "scope": scope})
        return self.request(
            "POST", f"/sessions/{session_id}/facts", json=body, idempotency_key=idempotency_key
        )

    def facts_list(
        self,
        session_id: str,
        *,
        decayed: bool | None = None,
        importance: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The session's facts with their decay state, most urgent first.

        Returns `{session, round, items, next_cursor}`."""
        params = {
            "decayed": None if decayed is None else str(decayed).lower(),
            "importance": importance,
            "cursor": cursor,
            "limit": limit,
        }
        return self.request("GET", f"/sessions/{session_id}/facts", params=params)

    def decay_report(self, session_id: str) -> dict[str, Any]:
        """The decayed facts with a recommendation each (restate_now / consider_restating / no_action)."""
        return self.facts_list(session_id, decayed=True)

    def fact_get(self, session_id: str, fact_id: str) -> dict[str, Any]:
        return self.request("GET", f"/sessions/{session_id}/facts/{fact_id}")

    def fact_reference(
        self, session_id: str, fact_id: str, *, note: str | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Mark a fact referenced in the current round (clears its decay)."""
        return self.request(
            "POST",
            f"/sessions/{session_id}/facts/{fact_id}/reference",
            json=_drop_none({"note": note}),
            idempotency_key=idempotency_key,
        )

    def fact_delete(self, session_id: str, fact_id: str, *, idempotency_key: str | None = None) -> None:
        self.request("DELETE", f"/sessions/{session_id}/facts/{fact_id}", idempotency_key=idempotency_key)

    def session_compress(
        self,
        session_id: str,
        *,
        target_ratio: float | None = None,
        up_to_seq: int | None = None,
        recent_messages: int | None = None,
        allow_truncation: bool | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """The history compressed by priority (messages are not changed): `{ratio, messages, dropped, …}`."""
        body = _drop_none(
            {
                "target_ratio": target_ratio,
                "up_to_seq": up_to_seq,
                "recent_messages": recent_messages,
                "allow_truncation": allow_truncation,
            }
        )
        return self.request(
            "POST", f"/sessions/{session_id}/compress", json=body, idempotency_key=idempotency_key
        )


class AsyncClient(_Base):
    """Asynchronous client (httpx.AsyncClient); the same methods as `Client`, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, retries=retries)
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """See Client.request."""
        method = method.upper()
        headers = self._headers(method, idempotency_key)
        url = self._url(path)
        query = _drop_none(params or {})
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await self._http.request(method, url, json=json, params=query, headers=headers)
            except httpx.TransportError as exc:
                if last:
                    raise NetworkError(f"{method} {url} failed: {exc}", code="network_error") from exc
                await asyncio.sleep(self._backoff(attempt, None))
                continue
            if not last and self._should_retry(response):
                await asyncio.sleep(self._backoff(attempt, response))
                continue
            return self._result(response)
        raise AssertionError("unreachable")  # pragma: no cover

    # --- sessions ---------------------------------------------------------------------------
    async def session_create(
        self,
        agent: str,
        *,
        user_id: str | None = None,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: int | None = None,
        idempotency_key: str | None = None,
    ) -> SessionOut:
        body = _drop_none(
            {
                "agent": agent,
                "user_id": user_id,
                "model": model,
                "metadata": metadata,
                "ttl_seconds": ttl_seconds,
            }
        )
        return await self.request("POST", "/sessions", json=body, idempotency_key=idempotency_key)

    async def session_get(self, session_id: str) -> SessionOut:
        return await self.request("GET", f"/sessions/{session_id}")

    async def sessions_list(
        self,
        *,
        agent: str | None = None,
        user_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page:
        params = {"agent": agent, "user_id": user_id, "status": status, "cursor": cursor, "limit": limit}
        return await self.request("GET", "/sessions", params=params)

    async def sessions_iter(self, **filters: Any) -> AsyncIterator[SessionOut]:
        cursor = None
        while True:
            page = await self.sessions_list(cursor=cursor, **filters)
            for item in page["items"]:
                yield item
            cursor = page["next_cursor"]
            if not cursor:
                return

    async def session_end(self, session_id: str, *, idempotency_key: str | None = None) -> SessionOut:
        return await self.request("POST", f"/sessions/{session_id}/end", idempotency_key=idempotency_key)

    async def session_delete(self, session_id: str, *, idempotency_key: str | None = None) -> None:
        await self.request("DELETE", f"/sessions/{session_id}", idempotency_key=idempotency_key)

    async def agent_latest_session(self, agent: str) -> SessionOut:
        return await self.request("GET", f"/agents/{agent}/latest-session")

    # --- messages ---------------------------------------------------------------------------
    async def message_append(
        self,
        session_id: str,
        *,
        role: str,
        content: str = "",
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> MessageOut:
        body = _message_body(role, content, fields)
        return await self.request(
            "POST", f"/sessions/{session_id}/messages", json=body, idempotency_key=idempotency_key
        )

    async def messages_append(
        self, session_id: str, messages: list[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> AppendOut:
        return await self.request(
            "POST",
            f"/sessions/{session_id}/messages",
            json={"messages": messages},
            idempotency_key=idempotency_key,
        )

    async def messages_list(
        self, session_id: str, *, after: int | None = None, limit: int | None = None
    ) -> MessagePage:
        return await self.request(
            "GET", f"/sessions/{session_id}/messages", params={"after": after, "limit": limit}
        )

    async def messages_iter(self, session_id: str, *, after: int = 0) -> AsyncIterator[MessageOut]:
        while True:
            page = await self.messages_list(session_id, after=after)
            for item in page["items"]:
                yield item
            if page["next_after"] is None:
                return
            after = page["next_after"]

    # --- memory search ----------------------------------------------------------------------
    async def memory_search(
        self,
        query: str,
        *,
        scope: MemoryScope | Mapping[str, Any] | None = None,
        kinds: list[str] | None = None,
        limit: int | None = None,
        time_range: Mapping[str, str] | None = None,
        plan: Mapping[str, Any] | None = None,
        neighbours: int | None = None,
    ) -> MemorySearchOut:
        """Search conversational memory (messages, summaries, facts, experiences) of a scope.

        scope: {agent, user_id, session, sessions: "current" | "all"}; time_range: {from, to} (ISO).
        """
        body = _drop_none(
            {"query": query, "scope": dict(scope) if scope is not None else None, "kinds": kinds,
             "limit": limit, "time_range": dict(time_range) if time_range is not None else None,
             "plan": dict(plan) if plan is not None else None, "neighbours": neighbours}
        )  # fmt: skip
        return await self.request("POST", "/memory/search", json=body)

    async def memory_index_status(self) -> dict[str, int]:
        """The tenant's messages per embedding status: {pending, completed, failed, skipped}."""
        return await self.request("GET", "/memory/index")

    # --- tasks ------------------------------------------------------------------------------
    async def task_create(
        self,
        *,
        session: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        title: str | None = None,
        input: str | None = None,
        value_tier: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TaskOut:
        body = _drop_none(
            {
                "session": session,
                "agent": agent,
                "user_id": user_id,
                "title": title,
                "input": input,
                "value_tier": value_tier,
                "metadata": metadata,
            }
        )
        return await self.request("POST", "/tasks", json=body, idempotency_key=idempotency_key)

    async def tasks_list(
        self,
        *,
        session: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page:
        params = {
            "session": session,
            "agent": agent,
            "user_id": user_id,
            "status": status,
            "cursor": cursor,
            "limit": limit,
        }
        return await self.request("GET", "/tasks", params=params)

    async def task_get(self, task_id: str) -> TaskOut:
        return await self.request("GET", f"/tasks/{task_id}")

    async def task_update(
        self,
        task_id: str,
        *,
        status: str | None = None,
        output: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> TaskOut:
        body = _drop_none({"status": status, "output": output, "metadata": metadata})
        return await self.request("PATCH", f"/tasks/{task_id}", json=body, idempotency_key=idempotency_key)

    # --- events (flight recorder) -----------------------------------------------------------
    async def events_list(
        self,
        agent: str,
        *,
        after: int | None = None,
        limit: int | None = None,
        type: str | None = None,
        session: str | None = None,
    ) -> EventPage:
        return await self.request(
            "GET",
            f"/agents/{agent}/events",
            params={"after": after, "limit": limit, "type": type, "session": session},
        )

    async def events_iter(
        self, agent: str, *, after: int = 0, type: str | None = None
    ) -> AsyncIterator[EventOut]:
        while True:
            page = await self.events_list(agent, after=after, type=type)
            for item in page["items"]:
                yield item
            if page["next_after"] is None:
                return
            after = page["next_after"]

    async def event_emit(
        self,
        agent: str,
        type: str,
        payload: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
    ) -> EventOut:
        body = _drop_none({"type": type, "payload": payload or {}, "session": session})
        return await self.request(
            "POST", f"/agents/{agent}/events", json=body, idempotency_key=idempotency_key
        )

    # --- context engine ---
    async def context_build(
        self,
        session_id: str,
        input: str = "",
        *,
        model: str | None = None,
        system_parts: Mapping[str, str] | list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        open_questions: list[str] | None = None,
        next_actions: list[str] | None = None,
        budget: Mapping[str, Any] | None = None,
        mode: str | None = None,
        recall: Mapping[str, Any] | None = None,
        query: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """The next prompt for the session: messages, tools, manifest, budget, warnings, forecast.

        `recall` overrides the recall policy for this build (enabled, top_k, min_score, position,
        budget_share); `query` is what to recall for (default: the input).
        Raises PromptTooLong (its `details` carry the numbers) when even the minimal context does not fit."""
        body = _drop_none(
            {
                "input": input,
                "model": model,
                "system_parts": system_parts,
                "tools": tools,
                "open_questions": open_questions,
                "next_actions": next_actions,
                "budget": dict(budget) if budget else None,
                "mode": mode,
                "recall": dict(recall) if recall is not None else None,
                "query": query,
            }
        )
        return await self.request(
            "POST", f"/sessions/{session_id}/context", json=body, idempotency_key=idempotency_key
        )

    async def context_builds(self, session_id: str, *, limit: int | None = None) -> list[dict[str, Any]]:
        """The session's latest builds (budget samples with their manifests), newest first."""
        return (await self.request("GET", f"/sessions/{session_id}/context", params={"limit": limit}))[
            "builds"
        ]

    async def usage_report(
        self,
        session_id: str,
        *,
        input_tokens: int,
        output_tokens: int | None = None,
        cached_input_tokens: int | None = None,
        reasoning_tokens: int | None = None,
        build_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Report the provider's usage for a build (default: the latest); calibrates later estimates."""
        body = _drop_none(
            {
                "build_id": build_id,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                "gen_ai.usage.cache_read.input_tokens": cached_input_tokens,
                "gen_ai.usage.reasoning.output_tokens": reasoning_tokens,
            }
        )
        return await self.request(
            "POST", f"/sessions/{session_id}/usage", json=body, idempotency_key=idempotency_key
        )

    async def tokens_count(
        self,
        *,
        text: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        model: str = "gpt-4o",
    ) -> dict[str, Any]:
        """Count a text or a chat prompt for a model (exact for OpenAI encodings, else estimated)."""
        body = _drop_none({"text": text, "messages": messages, "tools": tools, "model": model})
        return await self.request("POST", "/tokens/count", json=body)

    async def models_list(self, *, provider: str | None = None) -> list[dict[str, Any]]:
        """Model profiles: built-in and the tenant's own."""
        return (await self.request("GET", "/models", params={"provider": provider}))["models"]

    async def model_get(self, name: str) -> dict[str, Any]:
        return await self.request("GET", f"/models/{name}")

    async def context_policy_get(self, session_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/sessions/{session_id}/context-policy")

    async def context_policy_set(self, session_id: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the session's context policy overrides (history_window, output_reserve, …)."""
        return await self.request(
            "PUT", f"/sessions/{session_id}/context-policy", json={"overrides": dict(overrides)}
        )

    async def summaries_list(self, session_id: str) -> list[dict[str, Any]]:
        return (await self.request("GET", f"/sessions/{session_id}/summaries"))["summaries"]

    async def summarise_now(self, session_id: str) -> dict[str, Any]:
        """Queue summarisation of the session (202)."""
        return await self.request("POST", f"/sessions/{session_id}/summaries")

    async def session_digest(self, session_id: str, *, version: int | None = None) -> DigestOut:
        """The session's digest (goals, decisions, findings, preferences, constraints, progress,
        open questions): the latest, or `version`. NotFound while it has none."""
        return await self.request("GET", f"/sessions/{session_id}/digest", params={"version": version})

    async def session_digests(
        self, session_id: str, *, cursor: str | None = None, limit: int | None = None
    ) -> DigestPage:
        """A page of the session's digest versions, newest first."""
        return await self.request(
            "GET", f"/sessions/{session_id}/digests", params={"cursor": cursor, "limit": limit}
        )

    async def session_digest_refresh(self, session_id: str) -> dict[str, Any]:
        """Queue an update of the session's digest now (202)."""
        return await self.request("POST", f"/sessions/{session_id}/digest")

    # --- experiences ---
    async def experience_create(
        self,
        problem: str,
        *,
        solution: str = "",
        cause: str = "",
        confidence: float | None = None,
        user_id: str | None = None,
        scope: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        task: str | None = None,
        supersedes: str | None = None,
        agent: str | None = None,
        merge: bool | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Store an experience (embedded asynchronously). `outcome` is created, or merged for an
        exact duplicate (`merge=False`: always a new row); `supersedes` hides that older
        experience behind this one; `agent` records which agent learnt it."""
        body = _drop_none(
            {"problem": problem, "solution": solution, "cause": cause, "confidence": confidence,
             "user_id": user_id, "scope": scope, "kind": kind, "key": key, "task": task,
             "supersedes": supersedes, "agent": agent, "merge": merge}
        )  # fmt: skip
        return await self.request("POST", "/experiences", json=body, idempotency_key=idempotency_key)

    async def experiences_create_bulk(
        self, items: list[Mapping[str, Any]], *, task: str | None = None, idempotency_key: str | None = None
    ) -> ExperienceBulkOut:
        """Create up to 1,000 experiences in one call, all or nothing (each item like
        experience_create's arguments: problem, solution, cause, confidence, user_id, scope, kind,
        key, agent, merge). Their embeddings are queued in batches."""
        body = _drop_none({"items": [dict(item) for item in items], "task": task})
        return await self.request("POST", "/experiences/bulk", json=body, idempotency_key=idempotency_key)

    async def experience_delete(self, experience_id: str, *, idempotency_key: str | None = None) -> None:
        """Delete an experience (its hidden merged duplicates too; what it superseded comes back)."""
        await self.request("DELETE", f"/experiences/{experience_id}", idempotency_key=idempotency_key)

    async def experience_policy_get(self) -> ExperiencePolicyOut:
        """The tenant's experience policy: capacity, merge rule, search weights (admin key)."""
        return await self.request("GET", "/tenant/policies/experiences")

    async def experience_policy_update(self, **changes: Any) -> ExperiencePolicyOut:
        """Change some experience policy fields, e.g. `capacity=20_000` (admin key)."""
        return await self.request("PATCH", "/tenant/policies/experiences", json=changes)

    async def experience_get(self, experience_id: str) -> dict[str, Any]:
        """One experience with provenance, merge and supersede links and embedding status."""
        return await self.request("GET", f"/experiences/{experience_id}")

    async def experiences_list(
        self, *, cursor: str | None = None, limit: int | None = None, **filters: Any
    ) -> dict[str, Any]:
        """A page {results, next_cursor}; filters: user_id, kind, embedding_status, extraction_method,
        include_superseded, as_of (ISO time), agent."""
        return await self.request("GET", "/experiences", params={"cursor": cursor, "limit": limit, **filters})

    async def experiences_search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        limit: int | None = None,
        sources: list[str] | None = None,
        weights: Mapping[str, float] | None = None,
        fusion: str | None = None,
        include_superseded: bool | None = None,
        as_of: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
    ) -> dict[str, Any]:
        """Hybrid search: {results: [{experience, score, similarity, text_score, contributions}], plan,
        warnings}. `agent`: only experiences that agent recorded."""
        body = _drop_none(
            {"query": query, "user_id": user_id, "limit": limit, "sources": sources,
             "weights": dict(weights) if weights is not None else None, "fusion": fusion,
             "include_superseded": include_superseded, "as_of": as_of, "kind": kind, "agent": agent}
        )  # fmt: skip
        return await self.request("POST", "/experiences/search", json=body)

    async def experience_feedback(
        self, experience_id: str, *, helpful: bool, note: str = "", session: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Report whether an experience helped; ranking takes it into account."""
        body = _drop_none({"helpful": helpful, "note": note, "session": session})
        return await self.request(
            "POST", f"/experiences/{experience_id}/feedback", json=body, idempotency_key=idempotency_key
        )

    async def experience_promote(
        self, kind: str, key: str, content: str, *, user_id: str | None = None, session: str | None = None,
        source: Any = None, idempotency_key: str | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Promote a preference / project_config / constraint to long-term (user-scoped) memory."""
        body = _drop_none(
            {"kind": kind, "key": key, "content": content, "user_id": user_id, "session": session,
             "source": source}
        )  # fmt: skip
        return await self.request("POST", "/experiences/promote", json=body, idempotency_key=idempotency_key)

    async def experiences_retry_embeddings(self, experience_ids: list[str] | None = None) -> dict[str, Any]:
        """Re-queue failed embeddings (all of the tenant's, or these): {requeued}."""
        body = _drop_none({"experiences": experience_ids})
        return await self.request("POST", "/experiences/embeddings/retry", json=body)

    async def task_distill(self, task_id: str, *, mode: str = "full") -> dict[str, Any]:
        """Distil a finished task: light (now, returns the experiences) or full (queued)."""
        return await self.request("POST", f"/tasks/{task_id}/distill", json={"mode": mode})

    # --- cognition ---
    # The calling agent of private context, messages and context views is `as_agent`
    # (the API also takes it as the X-Agent-Id header).
    async def state_get(self, agent: str) -> dict[str, Any]:
        """The agent's cognitive state (schema 1; version 0 and empty if never written)."""
        return await self.request("GET", f"/agents/{agent}/state")

    async def state_put(
        self,
        agent: str,
        state: dict[str, Any],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Replace the agent's cognitive state; `expected_version` → Conflict if it changed meanwhile."""
        return await self.request(
            "PUT",
            f"/agents/{agent}/state",
            json=state,
            params={"expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    async def state_patch(
        self,
        agent: str,
        patch: list[dict[str, Any]],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Change the agent's cognitive state by a JSON Patch (RFC 6902; paths relative to the state).

        A patch that does not apply → ValidationFailed (422 `invalid_patch`); nothing is stored."""
        return await self.request(
            "PATCH",
            f"/agents/{agent}/state",
            json={"patch": patch},
            params={"expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    async def state_restore(
        self,
        agent: str,
        checkpoint: str | int,
        *,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Make a checkpoint's state current again (a new state version and a new checkpoint)."""
        body = _drop_none({"checkpoint": str(checkpoint), "reason": reason})
        return await self.request(
            "POST", f"/agents/{agent}/state/restore", json=body, idempotency_key=idempotency_key
        )

    async def checkpoint_create(
        self,
        agent: str,
        *,
        reason: str | None = None,
        step: int | None = None,
        produced_by: str | None = None,
        state: dict[str, Any] | None = None,
        patch: list[dict[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Checkpoint the agent's state (writing `state`, or applying the JSON Patch `patch`, first)."""
        body = _drop_none(
            {"reason": reason, "step": step, "produced_by": produced_by, "state": state, "patch": patch}
        )
        return await self.request(
            "POST", f"/agents/{agent}/checkpoints", json=body, idempotency_key=idempotency_key
        )

    async def checkpoints_list(
        self, agent: str, *, cursor: str | None = None, limit: int | None = None
    ) -> Page:
        return await self.request(
            "GET", f"/agents/{agent}/checkpoints", params={"cursor": cursor, "limit": limit}
        )

    async def checkpoint_get(self, agent: str, ref: str | int) -> dict[str, Any]:
        """One checkpoint by seq or id, with the state it recorded."""
        return await self.request("GET", f"/agents/{agent}/checkpoints/{ref}")

    async def checkpoint_diff(self, agent: str, source: str | int, target: str | int) -> dict[str, Any]:
        """What changed between two checkpoints, one entry per JSON path."""
        return await self.request(
            "GET", f"/agents/{agent}/checkpoints/diff", params={"from": str(source), "to": str(target)}
        )

    async def recovered_state(self, agent: str, *, as_agent: str | None = None) -> dict[str, Any]:
        """Everything to resume after a crash; private context and inbox only with as_agent=agent."""
        return await self.request("GET", f"/agents/{agent}/recovered-state", params={"as_agent": as_agent})

    async def reducers_get(self, agent: str) -> dict[str, Any]:
        return await self.request("GET", f"/agents/{agent}/reducers")

    async def reducers_put(
        self, agent: str, reducers: list[dict[str, str]], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Declare how `agent.*` events fold: [{event_type, op: set|merge|append, target, source}]."""
        return await self.request(
            "PUT", f"/agents/{agent}/reducers", json={"reducers": reducers}, idempotency_key=idempotency_key
        )

    async def context_view(self, agent: str, task: str) -> dict[str, Any]:
        """The agent's view of a task: shared context, its private context, its inbox."""
        return await self.request(
            "GET", f"/agents/{agent}/context-view", params={"task": task, "as_agent": agent}
        )

    async def shared_context_get(self, task: str) -> dict[str, Any]:
        return await self.request("GET", f"/tasks/{task}/shared-context")

    async def shared_context_put(
        self,
        task: str,
        *,
        as_agent: str | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Replace the shared context (fields: goal, constraints, artifacts, decisions, dependencies)."""
        return await self.request(
            "PUT",
            f"/tasks/{task}/shared-context",
            json=fields,
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    async def shared_context_patch(
        self,
        task: str,
        *,
        as_agent: str | None = None,
        append: dict[str, list[Any]] | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Change some shared-context fields, and/or append items to its lists."""
        body = _drop_none({**fields, "append": append})
        return await self.request(
            "PATCH",
            f"/tasks/{task}/shared-context",
            json=body,
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    async def private_context_get(self, task: str, *, as_agent: str) -> dict[str, Any]:
        return await self.request("GET", f"/tasks/{task}/private-context", params={"as_agent": as_agent})

    async def private_context_put(
        self,
        task: str,
        data: dict[str, Any],
        *,
        as_agent: str,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        return await self.request(
            "PUT",
            f"/tasks/{task}/private-context",
            json={"data": data},
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    async def task_message_send(
        self,
        task: str,
        body: Any,
        *,
        as_agent: str,
        to: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Send a message on the task to `to` (None = broadcast)."""
        return await self.request(
            "POST",
            f"/tasks/{task}/messages",
            json={"to": to, "body": body},
            params={"as_agent": as_agent},
            idempotency_key=idempotency_key,
        )

    async def task_messages_list(
        self,
        task: str,
        *,
        as_agent: str,
        box: str | None = None,
        unread: bool | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Page:
        params = {"as_agent": as_agent, "box": box, "unread": unread, "cursor": cursor, "limit": limit}
        return await self.request("GET", f"/tasks/{task}/messages", params=params)

    async def task_messages_mark_read(
        self, task: str, *, as_agent: str, ids: list[str] | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return await self.request(
            "POST",
            f"/tasks/{task}/messages/read",
            json={"ids": ids},
            params={"as_agent": as_agent},
            idempotency_key=idempotency_key,
        )

    # --- decay ---
    async def fact_register(
        self,
        session_id: str,
        *,
        key: str,
        type: str,
        content: str,
        scope: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        body = _drop_none({"key": key, "type": type, "content": content, "scope": scope})
        return await self.request(
            "POST", f"/sessions/{session_id}/facts", json=body, idempotency_key=idempotency_key
        )

    async def facts_list(
        self,
        session_id: str,
        *,
        decayed: bool | None = None,
        importance: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        params = {
            "decayed": None if decayed is None else str(decayed).lower(),
            "importance": importance,
            "cursor": cursor,
            "limit": limit,
        }
        return await self.request("GET", f"/sessions/{session_id}/facts", params=params)

    async def decay_report(self, session_id: str) -> dict[str, Any]:
        return await self.facts_list(session_id, decayed=True)

    async def fact_get(self, session_id: str, fact_id: str) -> dict[str, Any]:
        return await self.request("GET", f"/sessions/{session_id}/facts/{fact_id}")

    async def fact_reference(
        self, session_id: str, fact_id: str, *, note: str | None = None, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        return await self.request(
            "POST",
            f"/sessions/{session_id}/facts/{fact_id}/reference",
            json=_drop_none({"note": note}),
            idempotency_key=idempotency_key,
        )

    async def fact_delete(self, session_id: str, fact_id: str, *, idempotency_key: str | None = None) -> None:
        await self.request(
            "DELETE", f"/sessions/{session_id}/facts/{fact_id}", idempotency_key=idempotency_key
        )

    async def session_compress(
        self,
        session_id: str,
        *,
        target_ratio: float | None = None,
        up_to_seq: int | None = None,
        recent_messages: int | None = None,
        allow_truncation: bool | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        body = _drop_none(
            {
                "target_ratio": target_ratio,
                "up_to_seq": up_to_seq,
                "recent_messages": recent_messages,
                "allow_truncation": allow_truncation,
            }
        )
        return await self.request(
            "POST", f"/sessions/{session_id}/compress", json=body, idempotency_key=idempotency_key
        )
