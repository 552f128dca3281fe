"""The bounds of the MCP tools' arguments, read where the server enforces them: the fields of the
REST input serializers (a string's length, a number's range, a choice's values, a list's length,
a date-time), the models' columns for ids in a URL, and the settings behind a field's size (a
message's content: `CTXAPP_MESSAGE_MAX_BYTES`). So a tool's schema states what the server
enforces, and changes with it. Server side (Django); the stdio server lists the tools the
server's /mcp lists.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from typing import Any

from django.db import models
from rest_framework import serializers

from ctxapp.mcp.schema import Bound


@functools.cache
def _owner(where: str) -> Any:
    """The serializer's declared fields, or the model, that `where` ("module:Qual.Name") names."""
    module, _, qualname = where.partition(":")
    owner: Any = importlib.import_module(module)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    if isinstance(owner, type) and issubclass(owner, models.Model):
        return owner
    return owner().fields


def _field_bounds(field: serializers.Field) -> dict[str, Any]:
    """What a serializer field enforces, as JSON schema keywords."""
    if isinstance(field, serializers.ListField):
        bounds: dict[str, Any] = {"items": _field_bounds(field.child)}
        if field.max_length is not None:
            bounds["maxItems"] = field.max_length
        if field.min_length is not None or not field.allow_empty:
            bounds["minItems"] = max(field.min_length or 0, 0 if field.allow_empty else 1)
        return bounds
    if isinstance(field, serializers.ChoiceField):
        return {"enum": [str(choice) for choice in field.choices]}
    if isinstance(field, serializers.DateTimeField):
        return {"format": "date-time"}
    if isinstance(field, serializers.IntegerField | serializers.FloatField):
        found = {"minimum": field.min_value, "maximum": field.max_value}
        return {key: value for key, value in found.items() if value is not None}
    if isinstance(field, serializers.CharField):
        # A field bounded in UTF-8 bytes (max_bytes) holds at most as many characters.
        limit = field.max_length if field.max_length is not None else getattr(field, "max_bytes", None)
        bounds = {} if limit is None else {"maxLength": limit}
        if not field.allow_blank:
            bounds["minLength"] = 1
        if isinstance(field, serializers.RegexField):
            bounds["pattern"] = next(
                validator.regex.pattern
                for validator in field.validators
                if hasattr(validator, "regex") and hasattr(validator.regex, "pattern")
            )
        return bounds
    return {}


def _bound(bound: Bound) -> dict[str, Any]:
    owner = _owner(bound.where)
    if isinstance(owner, type) and issubclass(owner, models.Model):  # an id in the URL: its column
        column = owner._meta.get_field(bound.field)
        assert isinstance(column, models.CharField)
        return {"maxLength": column.max_length}
    return _field_bounds(owner[bound.field])


def _merged(found: list[dict[str, Any]]) -> dict[str, Any]:
    """One argument sent to several fields (by `kind`): what any of them accepts."""
    merged = dict(found[0])
    for other in found[1:]:
        for key in list(merged):
            if key not in other:
                del merged[key]  # unbounded by one of them: by none
            elif key in ("maxLength", "maxItems", "maximum"):
                merged[key] = max(merged[key], other[key])
            elif key in ("minLength", "minItems", "minimum"):
                merged[key] = min(merged[key], other[key])
            elif key == "enum":
                merged[key] = list(dict.fromkeys([*merged[key], *other[key]]))
            elif merged[key] != other[key]:
                del merged[key]
    return merged


def bounds_resolve(bounds: Sequence[Bound]) -> dict[str, Any]:
    """The JSON schema bounds of an argument the server checks at `bounds`."""
    return _merged([_bound(bound) for bound in bounds])
