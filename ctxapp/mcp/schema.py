"""The parts every ctxapp MCP tool is made of: the REST request a call becomes (`Call`), a tool's
JSON schema, annotations and request builder (`ToolSpec`), where the server enforces each
argument's bounds (`Bound`), and the helpers that build its arguments' schemas and its request.
No Django, no SDK server: tools.py assembles the tools, bounds.py (on the server) reads
the bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Tool, ToolAnnotations

# What a REST error says when it names no field: never all a tool's caller is told.
GENERIC_REFUSAL = "The request body is not valid."


@dataclass(frozen=True)
class Call:
    """One REST request under /api/v1: what a tool call becomes. `fields` names the tool argument
    of each REST field (path) the call renamed or moved (`type` → `fact_type`, `scope.agent` →
    `agent`), so that the server's errors name what the caller sent."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Bound:
    """Where the server enforces an argument's bounds: a field of a REST input serializer
    (`where` = "module:Class.Inner") or of a model ("memory.models:Session"). The schema listed
    to a client states them as bounds.py reads them there, so it cannot drift from them."""

    where: str
    field: str


class RestError(ToolError):
    """The REST API refused a tool's request: its error code, message and details."""

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = dict(details or {})


def tool_error(code: str, message: str) -> ToolError:
    return ToolError(f"{code}: {message}")


def _field_problems(detail: Any, path: str = "") -> list[tuple[str, str]]:
    """(field path, first problem) of a REST error's `details.fields`, nested fields dotted."""
    if isinstance(detail, Mapping):
        found: list[tuple[str, str]] = []
        for key, value in detail.items():
            found += _field_problems(value, f"{path}.{key}" if path else str(key))
        return found
    if isinstance(detail, list) and detail:
        if isinstance(detail[0], Mapping | list):
            return _field_problems(detail[0], path)
        return [(path, str(detail[0]))]
    return [(path, str(detail))] if detail else []


def refusal_text(call: Call, error: RestError) -> str:
    """The REST error as the tool's `code: message`: every field named as the tool's argument
    (`fact_type`, not `type`), every bad field told, never only the generic message."""

    def argument(path: str) -> str:
        return call.fields.get(path, path)

    problems = _field_problems(error.details.get("fields"))
    paths = [path for path, _ in problems]
    parts: list[str] = []
    told: set[str] = set()
    head, sep, rest = error.message.partition(": ")
    if error.message and error.message != GENERIC_REFUSAL:
        if sep and (head in paths or head in call.fields):
            parts.append(f"{argument(head)}: {rest}")
            told.add(head)
        elif paths:  # a message about the first field that does not say which: say it
            parts.append(f"{argument(paths[0])}: {error.message}")
            told.add(paths[0])
        else:
            parts.append(error.message)
    for path, problem in problems:
        if path not in told:
            told.add(path)
            parts.append(f"{argument(path)}: {problem}" if path not in ("", "non_field_errors") else problem)
    return f"{error.code}: {'; '.join(parts) or error.message}"


def string_arg(description: str, *, enum: Sequence[str] = (), default: str | None = None) -> dict[str, Any]:
    """A string argument; its bounds come from the server (ToolSpec.bounds), an `enum` only when
    the value is the tool's own (not a REST field's)."""
    schema: dict[str, Any] = {"type": "string", "description": description}
    if default is not None:
        schema["default"] = default
    if enum:
        schema["enum"] = list(enum)
    return schema


def integer_arg(description: str, *, default: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": description}
    if default is not None:
        schema["default"] = default
    return schema


def number_arg(description: str, *, default: float | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number", "description": description}
    if default is not None:
        schema["default"] = default
    return schema


# What a tool's schema says of an argument, from where the server enforces it (bounds.py).
Resolver = Callable[[Sequence[Bound]], dict[str, Any]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    properties: dict[str, dict[str, Any]]
    request: Callable[[dict[str, Any]], Call]
    scope: str  # the API key scope its REST route needs: `read` tools change nothing
    bounds: Mapping[str, Sequence[Bound]]  # per argument: where the server enforces its bounds
    path_arguments: tuple[str, ...] = ()  # parts of the route's URL (required)
    required: tuple[str, ...] = ()  # required body fields
    idempotent: bool = True  # the same call again changes nothing more
    # Erases what cannot be had back (memory_forget). Others only add: sessions end, facts update by
    # key, and a corrected user memory keeps its old version in the history.
    destructive: bool = False

    @property
    def annotations(self) -> ToolAnnotations:
        return ToolAnnotations(
            read_only_hint=self.scope == "read",
            destructive_hint=self.destructive,
            idempotent_hint=self.idempotent,
            open_world_hint=False,
        )

    def listed(self, resolve: Resolver) -> Tool:
        """The tool as listed to a client, each argument with the bounds the server enforces."""
        properties = {
            name: _with_bounds(schema, resolve(self.bounds[name])) if name in self.bounds else schema
            for name, schema in self.properties.items()
        }
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        schema |= {"required": [*self.path_arguments, *self.required], "additionalProperties": False}
        return Tool(
            name=self.name,
            description=self.description,
            input_schema=schema,
            output_schema={"type": "object"},
            annotations=self.annotations,
        )

    def call(self, arguments: dict[str, Any]) -> Call:
        """The REST request for these arguments; only the URL's own parts are checked here."""
        unknown = sorted(set(arguments) - set(self.properties))
        if unknown:
            raise tool_error(
                "validation_error",
                f"{unknown[0]}: Unknown field. Known: {', '.join(sorted(self.properties))}.",
            )
        for name in (*self.path_arguments, *self.required):
            if arguments.get(name) is None:
                raise tool_error("validation_error", f"{name}: This field is required.")
        for name in self.path_arguments:
            value = arguments[name]
            if not isinstance(value, str) or not value:
                raise tool_error("validation_error", f"{name}: Must be a non-empty string.")
        return self.request(arguments)


def _with_bounds(schema: dict[str, Any], bounds: dict[str, Any]) -> dict[str, Any]:
    """An argument's schema with the server's bounds; an array's `items` merged, not replaced."""
    merged = {**schema, **{key: value for key, value in bounds.items() if key != "items"}}
    if "items" in bounds:
        merged["items"] = {**schema.get("items", {}), **bounds["items"]}
    return merged


def given(
    arguments: dict[str, Any], names: Sequence[str], rename: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The body fields among `arguments` (as given: the REST serializer judges them)."""
    rename = rename or {}
    return {rename.get(name, name): arguments[name] for name in names if name in arguments}


def fields_of(rename: Mapping[str, str], prefix: str = "") -> dict[str, str]:
    """A Call's `fields` for arguments sent as `rename[argument]` (under `prefix`, e.g. `scope.`)."""
    return {prefix + field: argument for argument, field in rename.items()}


def segment(value: str) -> str:
    return quote(value, safe="")


def required_string(arguments: dict[str, Any], name: str, why: str = "") -> str:
    value = arguments.get(name)
    if value is None:
        raise tool_error("validation_error", f"{name}: This field is required{why}.")
    if not isinstance(value, str) or not value:
        raise tool_error("validation_error", f"{name}: Must be a non-empty string.")
    return value
