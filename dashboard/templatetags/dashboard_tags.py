"""Small display filters for the dashboard templates."""

from __future__ import annotations

import json
import re
from typing import Any

from django import template

from dashboard.timeline import event_summary

register = template.Library()


@register.filter
def truncate_json(value: Any, length: int = 140) -> str:
    """Compact JSON of a payload, without the OpenTelemetry ids every event carries."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if not k.startswith("gen_ai.")}
    text = json.dumps(value, separators=(", ", ": "), ensure_ascii=False, default=str)
    return text if len(text) <= length else text[: length - 1] + "…"


@register.filter
def event_line(event: Any) -> str:
    """One readable sentence for an event (dashboard.timeline)."""
    return event_summary(event.type, event.payload)


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


@register.filter
def percent(value: Any, digits: int = 0) -> str:
    try:
        return f"{float(value) * 100:.{digits}f} %"
    except (TypeError, ValueError):
        return "—"


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def words(value: Any) -> str:
    """`consider_restating` → `consider restating`."""
    return str(value).replace("_", " ")


_BULLET = re.compile(r"^[-*•]\s+(.*)$")
HEADING_MAX_CHARS = 60


@register.filter
def text_blocks(value: Any) -> list[dict[str, Any]]:
    """A summary's text as the page shows it: paragraphs and bulleted lists, not one run-on line.

    A short line ending in ":" ("Decisions:") heads the list that follows, each "- " line is a
    bullet, a blank line ends a paragraph, and consecutive plain lines join into one paragraph."""
    blocks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for raw in str(value or "").splitlines():
        line = raw.strip()
        bullet = _BULLET.match(line)
        if not line:
            current = None
        elif bullet:
            if current is None or current["kind"] != "list":
                current = {"kind": "list", "heading": "", "items": []}
                blocks.append(current)
            current["items"].append(bullet.group(1))
        elif line.endswith(":") and len(line) <= HEADING_MAX_CHARS:
            current = {"kind": "list", "heading": line[:-1], "items": []}
            blocks.append(current)
        elif current is not None and current["kind"] == "paragraph":
            current["text"] += " " + line
        else:
            current = {"kind": "paragraph", "text": line}
            blocks.append(current)
    return blocks
