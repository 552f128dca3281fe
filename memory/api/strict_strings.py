"""Strings as sent: a number where a request body declares a string is refused, not coerced.

DRF's CharField turns 123 into "123" (its `to_internal_value` accepts numbers on purpose).
`BodySerializer` (memory/api/base.py), the base of every request body, checks each string field
here first (a list's or a dict's string items too), so `{"input": 123}` answers 422 naming `input`
like every other type error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

NOT_A_STRING = "Must be a string."


def _string_error(field: serializers.Field, value: Any) -> str | None:
    """Why `value` may not fill the string `field` (a number, which CharField would coerce), or None."""
    if isinstance(field, serializers.CharField) and value is not None and not isinstance(value, str):
        return NOT_A_STRING if isinstance(value, int | float) else None  # DRF refuses the rest itself
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        bad = next((i for i, item in enumerate(value) if _string_error(field.child, item)), None)
        return None if bad is None else f"Item {bad}: {NOT_A_STRING}"
    if isinstance(field, serializers.DictField) and isinstance(value, Mapping):
        bad_key = next((k for k, item in value.items() if _string_error(field.child, item)), None)
        return None if bad_key is None else f"{bad_key}: {NOT_A_STRING}"
    return None


def string_type_errors(
    fields: Mapping[str, serializers.Field], data: Mapping[str, Any]
) -> dict[str, list[str]]:
    """The fields of `data` that hold a number where a string is declared, with why."""
    errors = {}
    for name, field in fields.items():
        if name in data and not field.read_only:
            error = _string_error(field, data[name])
            if error is not None:
                errors[name] = [error]
    return errors
