"""The API's JSON parser: DRF's, plus a check that every string can be stored as text.

It also caps how deeply objects and arrays may nest (`CTXAPP_JSON_MAX_DEPTH`): a body nested
a thousand levels deep would otherwise exhaust Python's recursion limit somewhere downstream
(the decoder itself, a walk over the state, the JSON encoder of the database driver) and answer
500. Such a body answers 422 naming where the limit was crossed.

PostgreSQL text cannot hold a NUL character, and a lone UTF-16 surrogate ("\\ud800" in JSON)
is not Unicode text at all. Both are valid JSON, so without this check they would reach the
database (or the tokenizer, or the embedder) and fail there as a 500. Refusing them at the
door gives the caller a 422 that names the field, and every endpoint gets it for free.
"""

from __future__ import annotations

import io
import re
from typing import Any

from django.conf import settings
from rest_framework.parsers import JSONParser

from memory.exceptions import InvalidInput


def _problem(text: str) -> str | None:
    if "\x00" in text:
        return "Contains a NUL character (\\u0000), which cannot be stored as text."
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "Contains a lone UTF-16 surrogate, which is not valid Unicode text."
    return None


def find_unstorable_text(
    value: Any, path: str = "", *, max_depth: int | None = None, depth: int = 0
) -> tuple[str, str] | None:
    """The first (path, problem) of a string or key in `value` that is not storable text.

    With `max_depth`, an object or array nested deeper than that is a problem too.
    """
    if max_depth is not None and isinstance(value, dict | list) and depth >= max_depth:
        return path or "body", f"Nested deeper than {max_depth} levels of objects and arrays."
    if isinstance(value, str):
        problem = _problem(value)
        return (path or "body", problem) if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{key}" if path else str(key)
            problem = _problem(str(key))
            if problem:
                return name, problem
            found = find_unstorable_text(item, name, max_depth=max_depth, depth=depth + 1)
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = find_unstorable_text(item, f"{path}[{index}]", max_depth=max_depth, depth=depth + 1)
            if found:
                return found
    return None


def _nested_deeper(value: Any, max_depth: int, depth: int = 0) -> bool:
    """Whether an object or array in `value` is nested `max_depth` levels deep or more."""
    if isinstance(value, dict):
        return depth >= max_depth or any(_nested_deeper(v, max_depth, depth + 1) for v in value.values())
    if isinstance(value, list):
        return depth >= max_depth or any(_nested_deeper(v, max_depth, depth + 1) for v in value)
    return False


# In a UTF-8 JSON text a decoded string can hold a NUL or a lone surrogate only through a \u
# escape: the decoder refuses raw control characters, and the UTF-8 reader invalid bytes. A body
# without any such escape (most bodies: no NUL, no character outside the BMP) needs only the
# depth check, without a path built and a string encoded per value (a batch of 100: half the time).
_MAYBE_UNSTORABLE = re.compile(rb"\\u(?:0000|d[89a-f])", re.IGNORECASE)


class TextSafeJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        max_depth = settings.CTXAPP.json_max_depth
        raw = stream.read() if stream is not None else b""
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            data = super().parse(io.BytesIO(raw), media_type, parser_context)
        except RecursionError:
            # Deeper than the decoder can go at all, so far beyond the cap that no path is known.
            problem = f"Nested deeper than {max_depth} levels of objects and arrays."
            raise InvalidInput(f"body: {problem}", details={"fields": {"body": [problem]}}) from None
        plain = str(encoding).lower().replace("-", "") == "utf8" and not _MAYBE_UNSTORABLE.search(raw)
        if plain and (max_depth is None or not _nested_deeper(data, max_depth)):
            return data
        found = find_unstorable_text(data, max_depth=max_depth)
        if found:
            path, problem = found
            raise InvalidInput(f"{path}: {problem}", details={"fields": {path: [problem]}})
        return data


class JsonPatchParser(TextSafeJSONParser):
    """`Content-Type: application/json-patch+json` (RFC 6902): a JSON array of operations."""

    media_type = "application/json-patch+json"
