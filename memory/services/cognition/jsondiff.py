"""JSON values as stored and compared: compact text, an order-free hash, a JSON-path diff and its patch.

Pure (standard library only). `json_diff` is the shape the diff endpoint shows and delta storage
keeps; `json_patch_apply` replays it. Why not jsonpatch's `make_patch` (jsonpatch is used for
client-sent RFC 6902 patches): it emits string pointers and `move` operations and does not carry
the old value of a change, which the diff endpoint shows; stored deltas keep this shape.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from typing import Any


def json_text(value: Any) -> str:
    """Compact JSON that keeps key order (what is stored)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def json_sha256(value: Any) -> str:
    """A hash of the JSON value that ignores object key order."""
    canonical = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True, allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def json_same(a: Any, b: Any) -> bool:
    """Whether `a` and `b` are the same JSON value (types included). Pure."""
    # `1 == 1.0 == True` in Python, but they are three different JSON values.
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(json_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


Path = tuple[str | int, ...]


def json_diff(old: Any, new: Any, *, with_old: bool = True, path: Path = ()) -> list[dict[str, Any]]:
    """The operations that turn `old` into `new`, at JSON-path level.

    Objects are compared key by key and arrays index by index (removals listed from the end), so
    `json_patch_apply(old, json_diff(old, new)) == new`. Each operation is
    `{"op": "add"|"remove"|"replace", "path": [segments], "value": new, "old": old}`; `old` is
    left out when `with_old` is false (what delta storage keeps).
    """
    ops: list[dict[str, Any]] = []
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append(_op("remove", (*path, key), None, old[key], with_old))
        for key, value in new.items():
            if key not in old:
                ops.append(_op("add", (*path, key), value, None, with_old))
            elif not _same_scalar(old[key], value):
                ops.extend(json_diff(old[key], value, with_old=with_old, path=(*path, key)))
    elif isinstance(old, list) and isinstance(new, list):
        common = min(len(old), len(new))
        for index in range(common):
            if not _same_scalar(old[index], new[index]):
                ops.extend(json_diff(old[index], new[index], with_old=with_old, path=(*path, index)))
        for index in range(common, len(new)):
            ops.append(_op("add", (*path, index), new[index], None, with_old))
        for index in range(len(old) - 1, common - 1, -1):
            ops.append(_op("remove", (*path, index), None, old[index], with_old))
    elif not json_same(old, new):
        ops.append(_op("replace", path, new, old, with_old))
    return ops


def _same_scalar(a: Any, b: Any) -> bool:
    """A shortcut of json_same for the common case: two equal strings (or numbers, …) of one type."""
    return a is b or (type(a) is type(b) and type(a) in _SCALARS and a == b)


_SCALARS = frozenset({str, int, float, bool})


def _op(kind: str, path: Path, value: Any, old: Any, with_old: bool) -> dict[str, Any]:
    op: dict[str, Any] = {"op": kind, "path": list(path)}
    if kind != "remove":
        op["value"] = value
    if with_old and kind != "add":
        op["old"] = old
    return op


def json_patch_apply(document: Any, ops: Iterable[dict[str, Any]]) -> Any:
    """Apply `json_diff` operations to `document` in place (returns the result; the root may change)."""
    for op in ops:
        path = op["path"]
        if not path:
            document = copy.deepcopy(op["value"])
            continue
        parent = document
        for segment in path[:-1]:
            parent = parent[segment]
        last = path[-1]
        if op["op"] == "remove":
            parent.pop(last)
        elif op["op"] == "add" and isinstance(parent, list):
            parent.insert(last, copy.deepcopy(op["value"]))
        else:
            parent[last] = copy.deepcopy(op["value"])
    return document


def json_pointer(path: Iterable[str | int]) -> str:
    """RFC 6901 JSON Pointer of a path (`/working_memory/notes/3`)."""
    return "".join("/" + str(seg).replace("~", "~0").replace("/", "~1") for seg in path)
