"""The parts every ctxapp MCP tool is made of: the REST request a call becomes (`Call`), a tool's
JSON schema, annotations and request builder (`ToolSpec`), and the helpers that build its
arguments' schemas and its request. No Django, no SDK server: mcp_tools.py assembles the tools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Tool, ToolAnnotations

# The bounds of the REST input serializers (tests/test_mcp.py holds them equal).
SEARCH_MAX_LIMIT = 100
SEARCH_MAX_NEIGHBOURS = 5
QUERY_MAX_LENGTH = 4000
FACTS_MAX_LIMIT = 1000
NAME_MAX_LENGTH = 200


@dataclass(frozen=True)
class Call:
    """One REST request under /api/v1: what a tool call becomes."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


def tool_error(code: str, message: str) -> ToolError:
    return ToolError(f"{code}: {message}")


def string_arg(
    description: str, *, max_length: int | None = None, enum: Sequence[str] = (), default: str | None = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": description}
    if default is not None:
        schema["default"] = default
    if max_length is not None:
        schema["maxLength"] = max_length
    if enum:
        schema["enum"] = list(enum)
    return schema


def integer_arg(
    description: str, *, minimum: int, maximum: int, default: int | None = None
) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": description, "minimum": minimum}
    schema["maximum"] = maximum
    if default is not None:
        schema["default"] = default
    return schema


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    properties: dict[str, dict[str, Any]]
    request: Callable[[dict[str, Any]], Call]
    scope: str  # the API key scope its REST route needs: `read` tools change nothing
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

    def listed(self) -> Tool:
        schema: dict[str, Any] = {"type": "object", "properties": self.properties}
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
        for name in self.path_arguments:
            value = arguments.get(name)
            if value is None:
                raise tool_error("validation_error", f"{name}: This field is required.")
            if not isinstance(value, str) or not value:
                raise tool_error("validation_error", f"{name}: Must be a non-empty string.")
        return self.request(arguments)


def given(
    arguments: dict[str, Any], names: Sequence[str], rename: dict[str, str] | None = None
) -> dict[str, Any]:
    """The body fields among `arguments` (as given: the REST serializer judges them)."""
    rename = rename or {}
    return {rename.get(name, name): arguments[name] for name in names if name in arguments}


def segment(value: str) -> str:
    return quote(value, safe="")


def required_string(arguments: dict[str, Any], name: str, why: str = "") -> str:
    value = arguments.get(name)
    if value is None:
        raise tool_error("validation_error", f"{name}: This field is required{why}.")
    if not isinstance(value, str) or not value:
        raise tool_error("validation_error", f"{name}: Must be a non-empty string.")
    return value
