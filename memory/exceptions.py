"""Errors a client can act on. Each has a stable code and an HTTP status.

The API's exception handler (ctxapp/api_errors.py) turns any of these into
`{"error": {"code", "message", "details"}}` and rolls back the transaction.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    code = "error"
    http_status = 400
    default_message = "The request could not be completed."

    def __init__(self, message: str | None = None, *, details: dict[str, Any] | None = None) -> None:
        self.message = message or self.default_message
        self.details = details or {}
        super().__init__(self.message)


class NotFound(DomainError):
    """A missing id and another tenant's id answer exactly alike."""

    code, http_status = "not_found", 404
    default_message = "Not found."

    @classmethod
    def of(cls, kind: str, public_id: str) -> NotFound:
        return cls(f"No {kind} with id {public_id!r}.", details={"kind": kind, "id": public_id})


class InvalidInput(DomainError):
    code, http_status = "validation_error", 422
    default_message = "The request body is not valid."


class Conflict(DomainError):
    code, http_status = "conflict", 409
    default_message = "The request conflicts with the current state."


class IdempotencyConflict(Conflict):
    code = "idempotency_conflict"
    default_message = (
        "This Idempotency-Key was already used with a different request. "
        "Use a new key for a new request."
    )


class IdempotencyInProgress(Conflict):
    code = "idempotency_in_progress"
    default_message = "A request with this Idempotency-Key is still being processed; retry shortly."


class SessionEnded(Conflict):
    code = "session_ended"
    default_message = "The session is no longer open; start a new session."
