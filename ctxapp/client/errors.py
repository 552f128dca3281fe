"""The client's exceptions: one class per API error code, all subclasses of `CtxappError`."""

from __future__ import annotations

from typing import Any

import httpx


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
    # user memory
    "memory_superseded": Conflict,
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
