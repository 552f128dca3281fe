"""LangGraph checkpoint values as a person reads them on the agent page.

CtxappSaver (ctxapp/integrations/langgraph.py) keeps each value as `{"json": …}` or, when it is
not plain JSON, as LangGraph's serde output `{"type": …, "b64": …}`, or, when it is too large for
the state, as a reference to a blob of the agent `{"type": …, "blob": <sha256>, "size": …}`. Here
the packed values of `working_memory.langgraph` are shown decoded (through langgraph's public
JsonPlusSerializer, where langgraph is installed) instead of as base64; otherwise, and for a
blob, their type and size.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from datetime import date, datetime, time
from typing import Any

PACKED_FIELDS = ("checkpoint", "metadata")


def _jsonable(value: Any) -> Any:
    """A JSON-ready view of a decoded value (messages and other models as their fields)."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return {"__type__": type(value).__name__, **value.model_dump()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__, **dataclasses.asdict(value)}
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)


def _decoder() -> Any | None:
    try:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # lazy: optional-dependency
    except ImportError:
        return None
    return JsonPlusSerializer()


def _unpack(packed: Any, serde: Any | None) -> Any:
    if not isinstance(packed, dict):
        return packed
    if set(packed) == {"json"}:
        return packed["json"]
    if set(packed) == {"type", "blob", "size"}:
        return f"({packed['type']}, {packed['size']} bytes, kept as blob {str(packed['blob'])[:12]}…)"
    if set(packed) != {"type", "b64"}:
        return packed
    try:
        data = base64.b64decode(packed["b64"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        return packed
    if serde is None:
        return f"({packed['type']}, {len(data)} bytes; install langgraph to see it decoded)"
    try:
        return _jsonable(serde.loads_typed((packed["type"], data)))
    except Exception:
        return f"({packed['type']}, {len(data)} bytes that this langgraph cannot decode)"


def langgraph_values_decoded(state: Any) -> Any:
    """`state` with its LangGraph document's packed values decoded (unchanged when there is none)."""
    document = state.get("working_memory", {}).get("langgraph") if isinstance(state, dict) else None
    if not isinstance(document, dict):
        return state
    serde = _decoder()
    decoded = dict(document)
    for name in PACKED_FIELDS:
        if name in decoded:
            decoded[name] = _unpack(decoded[name], serde)
    if isinstance(decoded.get("channel_values"), dict):
        decoded["channel_values"] = {key: _unpack(v, serde) for key, v in decoded["channel_values"].items()}
    return {**state, "working_memory": {**state["working_memory"], "langgraph": decoded}}
