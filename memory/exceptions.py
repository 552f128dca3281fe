"""Errors a client can act on. Each has a stable code and an HTTP status.

The API's exception handler (ctxapp/api_errors.py) turns any of these into
`{"error": {"code", "message", "details"}}` and rolls back the transaction.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """The base of every error a client can act on: a stable `code`, an HTTP status and a default
    message. A subclass names its code and status in its header, e.g.
    `class SessionEnded(Conflict, code="session_ended")`; the status is inherited when omitted."""

    code = "error"
    http_status = 400
    default_message = "The request could not be completed."

    def __init_subclass__(
        cls, *, code: str | None = None, http_status: int | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = code
        if http_status is not None:
            cls.http_status = http_status

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        self.message = message or self.default_message
        self.details = details or {}
        super().__init__(self.message)


class NotFound(DomainError, code="not_found", http_status=404):
    """A missing id and another tenant's id answer exactly alike."""

    default_message = "Not found."

    @classmethod
    def of(cls, kind: str, public_id: str) -> NotFound:
        return cls(f"No {kind} with id {public_id!r}.", details={"kind": kind, "id": public_id})


class InvalidInput(DomainError, code="validation_error", http_status=422):
    default_message = "The request body is not valid."


class Conflict(DomainError, code="conflict", http_status=409):
    default_message = "The request conflicts with the current state."


class IdempotencyConflict(Conflict, code="idempotency_conflict"):
    default_message = (
        "This Idempotency-Key was already used with a different request. Use a new key for a new request."
    )


class IdempotencyInProgress(Conflict, code="idempotency_in_progress"):
    default_message = "A request with this Idempotency-Key is still being processed; retry shortly."


class SessionEnded(Conflict, code="session_ended"):
    default_message = "The session is no longer open; start a new session."


# --- sessions (agent API and flight recorder) ----------------------------------------------------


class PayloadTooLarge(DomainError, code="payload_too_large", http_status=413):
    """A field is over its size limit; `details.field` names it."""

    default_message = "A field of the request is larger than its limit."


class NoSession(NotFound, code="no_session"):
    default_message = "This agent has no session yet: create one with POST /api/v1/sessions."


class TaskFinished(Conflict, code="task_finished"):
    default_message = "The task already finished (succeeded or failed); its status and output are final."


class InvalidTransition(Conflict, code="invalid_transition"):
    default_message = "This status change is not allowed."


# --- cognition (cognitive state, checkpoints, context layers, recovery) ------------------------


class InvalidState(DomainError, code="invalid_state", http_status=400):
    """A cognitive state with a wrong type in it; `details.field` names the JSON path."""

    default_message = "The cognitive state is not valid."


class InvalidPatch(DomainError, code="invalid_patch", http_status=422):
    """A JSON Patch (RFC 6902) that is malformed or does not apply to the current state."""

    default_message = "The JSON Patch does not apply to the current state; nothing was stored."


class SchemaVersionUnsupported(DomainError, code="schema_version_unsupported", http_status=422):
    default_message = "The state's schema_version is newer than this server supports."


class VersionConflict(Conflict, code="version_conflict"):
    default_message = "The document changed since you read it; read it again and retry with its version."


class CheckpointCorrupt(DomainError, code="checkpoint_corrupt", http_status=500):
    default_message = "A checkpoint could not be reconstructed to the state it recorded."


class AgentMismatch(DomainError, code="agent_mismatch", http_status=403):
    default_message = "Only the agent itself may read this (the X-Agent-Id header names another agent)."


# --- context engine ---------------------------------------------------------------------------


class PromptTooLong(DomainError, code="prompt_too_long", http_status=422):
    """Even the minimal context (required system parts, tools, high-importance facts, the new
    input) does not fit the gate. `details` carries the numbers."""

    default_message = "The prompt is too long for the model even with every optional part dropped."
