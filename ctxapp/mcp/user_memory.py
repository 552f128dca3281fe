"""The user memory tools: what is known about a user, listed, corrected and forgotten, and what
`remember` does with kind="user_memory". Each call is one REST request under
/api/v1/users/{user_id}/memories (docs/api.md, "User memory")."""

from __future__ import annotations

from typing import Any

from ctxapp.mcp.schema import (
    Bound,
    Call,
    ToolSpec,
    fields_of,
    given,
    integer_arg,
    number_arg,
    required_string,
    segment,
    string_arg,
    tool_error,
)

USER_ARG = string_arg("The user's id (the `user_id` of their sessions).")
MEMORY_ARG = string_arg("The user memory's id (`umem_…`), from memory_list.")
# Where the REST API enforces the arguments (bounds.py reads them there).
USER_MEMORY_INPUT = "memory.api.users:UserMemoryListApi.InputSerializer"
USER_MEMORY_FILTER = "memory.api.users:UserMemoryListApi.FilterSerializer"
USER_MEMORY_PATCH = "memory.api.users:UserMemoryDetailApi.PatchSerializer"
USER_BOUND = Bound("memory.models:UserMemory", "user_id")
MEMORY_BOUND = Bound("memory.models:UserMemory", "public_id")
REMEMBER_FIELDS = {"content": "text", "memory_type": "type"}


def user_memories_path(arguments: dict[str, Any], memory: str | None = None) -> str:
    path = f"/users/{segment(required_string(arguments, 'user_id'))}/memories"
    return path if memory is None else f"{path}/{segment(memory)}"


def user_memory_remember(arguments: dict[str, Any]) -> Call:
    """`remember` with kind="user_memory": record the current value of `subject` for the user."""
    for name in ("session", "fact_type", "key"):
        if name in arguments:
            raise tool_error("validation_error", f"{name}: Not with kind=user_memory (it outlives sessions).")
    required_string(arguments, "subject", " (kind=user_memory)")
    names = ("subject", "content", "memory_type")
    body = given(arguments, names, REMEMBER_FIELDS)
    return Call("POST", user_memories_path(arguments), body=body, fields=fields_of(REMEMBER_FIELDS))


def _memory_list(arguments: dict[str, Any]) -> Call:
    params = given(arguments, ("as_of", "type", "cursor", "limit"))
    return Call("GET", user_memories_path(arguments), params=params)


def _memory_update(arguments: dict[str, Any]) -> Call:
    body = given(arguments, ("text", "type", "confidence"))
    return Call("PATCH", user_memories_path(arguments, arguments["memory"]), body=body)


def _memory_forget(arguments: dict[str, Any]) -> Call:
    return Call("DELETE", user_memories_path(arguments, arguments["memory"]))


USER_MEMORY_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="memory_list",
        description=(
            "What is known about a user: their current memories (profile, preferences, decisions, "
            "constraints, plans, facts), or those current at a past moment (`as_of`). Returns `items` "
            "(id, subject, type, text, sources, confidence, valid_from, valid_to, superseded_by), newest "
            "first; `next` (null on the last page) is the `cursor` of the next page."
        ),
        properties={
            "user_id": USER_ARG,
            "as_of": string_arg("An ISO 8601 moment, e.g. 2026-03-01T00:00:00Z: the memories current then."),
            "type": string_arg("Only memories of this type."),
            "cursor": string_arg("The `next` of the previous page."),
            "limit": integer_arg("Memories per page (default: the server's page size, CTXAPP_PAGE_SIZE)."),
        },
        bounds={
            "user_id": (USER_BOUND,),
            **{name: (Bound(USER_MEMORY_FILTER, name),) for name in ("as_of", "type", "cursor", "limit")},
        },
        scope="read",
        request=_memory_list,
        path_arguments=("user_id",),
    ),
    ToolSpec(
        name="memory_update",
        description=(
            "Correct a current memory about a user: the answer is a new version (its own id) that "
            "supersedes it, with the same subject; the old value stays in the history. Updating a "
            "memory that is no longer current is refused (memory_superseded): update the newer one."
        ),
        properties={
            "user_id": USER_ARG,
            "memory": MEMORY_ARG,
            "text": string_arg("The corrected text (non-empty)."),
            "type": string_arg("The corrected type."),
            "confidence": number_arg("How sure the memory is, 0 to 1."),
        },
        bounds={
            "user_id": (USER_BOUND,),
            "memory": (MEMORY_BOUND,),
            **{name: (Bound(USER_MEMORY_PATCH, name),) for name in ("text", "type", "confidence")},
        },
        scope="write",
        request=_memory_update,
        path_arguments=("user_id", "memory"),
    ),
    ToolSpec(
        name="memory_forget",
        description=(
            "Erase one memory about a user, with every earlier version of its subject (later versions "
            "stay). Cannot be undone. Returns the erased ids."
        ),
        properties={"user_id": USER_ARG, "memory": MEMORY_ARG},
        bounds={"user_id": (USER_BOUND,), "memory": (MEMORY_BOUND,)},
        scope="write",
        destructive=True,
        request=_memory_forget,
        path_arguments=("user_id", "memory"),
    ),
)
