"""The cognitive state document: schema 1, its fields, validation, upgrades and size limit. Pure.

A state is a JSON object of `STATE_FIELDS`; a state of an older schema (0: unversioned, flat
goal/constraints) is upgraded on read and on write; a newer one is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import jsonpatch
from django.conf import settings

from memory.exceptions import InvalidPatch, InvalidState, PayloadTooLarge, SchemaVersionUnsupported
from memory.models import STATE_SCHEMA_VERSION, empty_state

STATE_FIELDS = ("context", "observation", "working_memory", "decision", "tool_state")
READ_ONLY_FIELDS = frozenset({"agent", "version", "checkpoint", "updated_at", "upgraded_from"})
# Schema 0 (unversioned, legacy): flat goal/constraints, `memory` and `tools`.
LEGACY_FIELDS = {
    "goal": ("context", "goal"),
    "constraints": ("context", "constraints"),
    "memory": ("working_memory", None),
    "tools": ("tool_state", None),
    "observation": ("observation", None),
    "decision": ("decision", None),
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _require(field: str, value: Any, allowed: tuple[str, ...]) -> None:
    if _type_name(value) not in allowed:
        raise InvalidState(
            f"Field {field!r} must be {' or '.join(allowed)}, not {_type_name(value)}.",
            details={"field": field, "expected": list(allowed), "got": _type_name(value)},
        )


def _check_finite(field: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidState(f"Field {field!r} holds a number JSON cannot represent.", details={"field": field})
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(f"{field}.{key}", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(f"{field}[{index}]", item)


def _has_nonfinite(value: Any) -> bool:
    # _check_finite's walk without building a name per key (most states have no bad number).
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_nonfinite(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_nonfinite(item) for item in value)
    return False


@dataclass(frozen=True)
class StateInput:
    """A state as a client wrote it, checked and upgraded to the current schema (state_input_parse)."""

    document: dict[str, Any]
    came_in: int  # the schema_version it was written in (0 = unversioned, upgraded)


def state_input_parse(raw: Any) -> StateInput:
    """Check a client's state at the edge (the API's views): see state_normalize for what it raises."""
    document, came_in = state_normalize(raw)
    return StateInput(document, came_in)


def state_normalize(raw: Any) -> tuple[dict[str, Any], int]:
    """Validate a state as written by a client; return (schema-1 document, version it came in).

    Pure. An unversioned state is schema 0 and upgraded; a newer schema raises
    SchemaVersionUnsupported (422) naming both versions; a wrong type raises InvalidState (400)
    naming the field. Read-only fields a client echoes back (version, checkpoint, …) are ignored.
    """
    _require("state", raw, ("object",))
    version: Any = raw.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidState(
            "Field 'schema_version' must be a non-negative integer.",
            details={"field": "schema_version", "got": _type_name(version)},
        )
    if version > STATE_SCHEMA_VERSION:
        raise SchemaVersionUnsupported(
            f"This state has schema_version {version}; this server supports up to {STATE_SCHEMA_VERSION}. "
            "Nothing was stored.",
            details={"schema_version": version, "supported_schema_version": STATE_SCHEMA_VERSION},
        )
    body = {k: v for k, v in raw.items() if k != "schema_version" and k not in READ_ONLY_FIELDS}
    if version == 0:
        body = _upgrade_v0(body)
    unknown = [key for key in body if key not in STATE_FIELDS]
    if unknown:
        raise InvalidState(
            f"Unknown field {unknown[0]!r}; a state has {', '.join(STATE_FIELDS)}.",
            details={"field": unknown[0], "allowed": list(STATE_FIELDS)},
        )
    document = empty_state()
    document.update(body)
    _require("context", document["context"], ("object",))
    if "goal" in document["context"]:
        _require("context.goal", document["context"]["goal"], ("string", "null"))
    if "constraints" in document["context"]:
        _require("context.constraints", document["context"]["constraints"], ("array",))
    _require("observation", document["observation"], ("object", "string", "null"))
    _require("working_memory", document["working_memory"], ("object",))
    _require("decision", document["decision"], ("object", "string", "null"))
    _require("tool_state", document["tool_state"], ("object",))
    for field in STATE_FIELDS:
        if _has_nonfinite(document[field]):  # then name where
            _check_finite(field, document[field])
    return {field: document[field] for field in STATE_FIELDS}, version


def _upgrade_v0(body: dict[str, Any]) -> dict[str, Any]:
    upgraded: dict[str, Any] = {}
    for key, value in body.items():
        if key in STATE_FIELDS and key not in LEGACY_FIELDS:
            upgraded[key] = value
            continue
        if key not in LEGACY_FIELDS:
            upgraded[key] = value  # rejected as unknown by the caller, with its name
            continue
        field, sub = LEGACY_FIELDS[key]
        if sub is None:
            upgraded[field] = value
        else:
            context = upgraded.setdefault("context", {"goal": None, "constraints": []})
            _require("context", context, ("object",))
            context[sub] = value
    return upgraded


def state_load(text: str, schema_version: int) -> dict[str, Any]:
    """A stored state document (possibly of an older schema) as schema 1. Fresh objects every call."""
    raw = json.loads(text)
    if schema_version == STATE_SCHEMA_VERSION:
        return raw
    raw["schema_version"] = schema_version
    return state_normalize(raw)[0]


def state_patched(*, document: dict[str, Any], patch: Any) -> dict[str, Any]:
    """`document` (a schema-1 state, changed in place) with the JSON Patch (RFC 6902) `patch` applied.

    Paths are relative to the state (`/working_memory/notes/0`). Pure. Raises InvalidPatch (422)
    for a malformed patch or one that does not apply (a failed `test`, a missing path); the
    result is then validated like a whole state (state_normalize).
    """
    if not isinstance(patch, list) or not all(isinstance(op, dict) for op in patch):
        raise InvalidPatch(
            "A JSON Patch is a list of operations: [{op, path, value?, from?}, …] (RFC 6902).",
            details={"fields": {"patch": ["Must be a list of operation objects."]}},
        )
    try:
        patched = jsonpatch.JsonPatch(patch).apply(document, in_place=True)
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError) as exc:
        raise InvalidPatch(
            f"The JSON Patch does not apply to the current state: {exc}. Nothing was stored.",
            details={"fields": {"patch": [str(exc)]}},
        ) from None
    if not isinstance(patched, dict):
        raise InvalidPatch(
            "The JSON Patch replaced the whole state with a non-object.",
            details={"fields": {"patch": ["The result must be a state object."]}},
        )
    return state_normalize({"schema_version": STATE_SCHEMA_VERSION, **patched})[0]


def state_check_size(text: str, field: str) -> None:
    """Raise PayloadTooLarge (413) when `text` exceeds CTXAPP_STATE_MAX_BYTES; `field` names it."""
    limit = settings.CTXAPP.state_max_bytes
    if len(text.encode()) > limit:
        raise PayloadTooLarge(
            f"The {field} is larger than the limit of {limit} bytes.",
            details={"field": field, "limit_bytes": limit},
        )
