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

Layout: each operation is written once, as a request builder (`_conversation.py`,
`_knowledge.py`) over the sans-IO core (`_core.py`: requests, retries, answers); `sync.py` and
`asyncio.py` are the two transports; `errors.py` the exceptions; `types.py` the answers' shapes.

This package must stay importable without Django: it imports nothing from ctxapp's server side.
"""

from __future__ import annotations

from ctxapp.client._core import (
    API_PREFIX,
    BACKOFF_BASE,
    BACKOFF_MAX,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    RETRYABLE_STATUSES,
    WRITE_METHODS,
    Pages,
    Request,
)
from ctxapp.client.asyncio import AsyncClient
from ctxapp.client.errors import (
    ERROR_CODES,
    STATUS_FALLBACK,
    Conflict,
    CtxappError,
    Forbidden,
    IdempotencyConflict,
    IdempotencyInProgress,
    NetworkError,
    NotFound,
    PayloadTooLarge,
    PromptTooLong,
    RateLimited,
    ServerError,
    SessionEnded,
    TaskFinished,
    Unauthorized,
    ValidationFailed,
    error_from_response,
)
from ctxapp.client.sync import Client
from ctxapp.client.types import (
    AgentOut,
    AppendedMessage,
    AppendOut,
    CheckpointOut,
    CheckpointPage,
    DigestItem,
    DigestOut,
    DigestPage,
    EventOut,
    EventPage,
    ExperienceBulkOut,
    ExperienceDetailOut,
    ExperienceOut,
    ExperiencePage,
    ExperiencePolicyOut,
    ForgetReceiptOut,
    MemoryHit,
    MemoryNeighbour,
    MemoryScope,
    MemorySearchOut,
    MessageOut,
    MessagePage,
    Page,
    RedactReceiptOut,
    SessionOut,
    TaskOut,
)

__all__ = [
    "API_PREFIX",
    "BACKOFF_BASE",
    "BACKOFF_MAX",
    "DEFAULT_RETRIES",
    "DEFAULT_TIMEOUT",
    "ERROR_CODES",
    "RETRYABLE_STATUSES",
    "STATUS_FALLBACK",
    "WRITE_METHODS",
    "AgentOut",
    "AppendOut",
    "AppendedMessage",
    "AsyncClient",
    "CheckpointOut",
    "CheckpointPage",
    "Client",
    "Conflict",
    "CtxappError",
    "DigestItem",
    "DigestOut",
    "DigestPage",
    "EventOut",
    "EventPage",
    "ExperienceBulkOut",
    "ExperienceDetailOut",
    "ExperienceOut",
    "ExperiencePage",
    "ExperiencePolicyOut",
    "Forbidden",
    "ForgetReceiptOut",
    "IdempotencyConflict",
    "IdempotencyInProgress",
    "MemoryHit",
    "MemoryNeighbour",
    "MemoryScope",
    "MemorySearchOut",
    "MessageOut",
    "MessagePage",
    "NetworkError",
    "NotFound",
    "Page",
    "Pages",
    "PayloadTooLarge",
    "PromptTooLong",
    "RateLimited",
    "RedactReceiptOut",
    "Request",
    "ServerError",
    "SessionEnded",
    "SessionOut",
    "TaskFinished",
    "TaskOut",
    "Unauthorized",
    "ValidationFailed",
    "error_from_response",
]
