"""One readable line per event, for the flight-recorder timeline.

The event log stores each event's payload as JSON. Operators read it as a timeline: one sentence
per event type, built from the payload's fields, with the full payload on expand. A type without a
sentence of its own (or a payload missing a field its sentence needs) falls back to its scalar
fields, "key value · key value", each value shortened at a word boundary — never cut mid-word.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SENTENCES: dict[str, str] = {
    "session.created": "Session started{user}",
    "session.ended": "Session ended after {message_count} messages, {token_count} tokens",
    "session.deleted": "Session deleted ({message_count} messages)",
    "message.added": "{role} message #{seq}, {tokens} tokens",
    "context.built": "Context built for {gen_ai_request_model}: {prompt_tokens} of {input_limit} tokens",
    "summary.created": "Summary folded {folded_count} messages (up to #{covers_up_to_seq})",
    "digest.updated": "Digest version {version} written, up to #{covers_up_to_seq} ({method})",
    "checkpoint.created": "Checkpoint #{seq} ({reason})",
    "state.updated": "Cognitive state updated to version {version}",
    "agent.recovered": "Agent recovered from checkpoint #{checkpoint_seq}",
    "task.created": "Task {task} created: {title}",
    "task.updated": "Task {task} is {status}",
    "task.completed": "Task {task} {status}",
    "memory.distilled": "Task {task} distilled ({path} path)",
    "experience.created": "Experience {experience} stored",
    "experience.embedded": "Experience {experience} embedded with {model}",
    "experience.embedding_failed": "Embedding of {experience} failed: {reason}",
    "experience.merged": "Experience {duplicate} merged into {into}",
    "fact.registered": "Fact “{key}” registered ({importance} importance)",
    "fact.referenced": "Fact “{key}” referenced",
    "fact.decayed": "Fact “{key}” decayed: not referenced since round {last_referenced_round}",
    "fact.promoted": "Fact “{key}” promoted to long-term memory",
    "retention.evicted": "Retention removed {count} {kind}",
    "api_key.created": "API key {prefix} created",
    "api_key.revoked": "API key {prefix} revoked",
}

SHORT = 80  # characters of one value in a line


def shorten(value: Any, limit: int = SHORT) -> str:
    """`value` as text of at most `limit` characters, cut at a word boundary with an ellipsis."""
    text = " ".join(str(value).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:.") + "…"


class _Fields(dict[str, str]):
    """Payload fields by name, shortened; a missing one raises KeyError."""

    def __init__(self, payload: Mapping[str, Any]) -> None:
        # "gen_ai.request.model" is read as "{gen_ai_request_model}": format_map would take the dots
        # for attribute access.
        super().__init__({k.replace(".", "_"): shorten(v) for k, v in payload.items() if _is_scalar(v)})
        user = payload.get("user_id")
        self["user"] = f" for user {shorten(user)}" if user else ""
        for key, value in payload.items():
            if isinstance(value, list):
                self.setdefault(key, f"{len(value)} item{'s' if len(value) != 1 else ''}")


def _is_scalar(value: Any) -> bool:
    return value is not None and isinstance(value, str | int | float | bool)


def event_summary(event_type: str, payload: Any) -> str:
    """One line that says what happened, from the event's type and payload."""
    payload = payload if isinstance(payload, Mapping) else {}
    fields = _Fields(payload)
    sentence = SENTENCES.get(event_type)
    if sentence is not None:
        try:
            line = sentence.format_map(fields)
        except (KeyError, ValueError, IndexError):
            line = ""
        if line:
            return line[0].upper() + line[1:]
    parts = [
        f"{key.replace('_', ' ')} {value}"
        for key, value in fields.items()
        if value and key != "user" and not key.startswith("gen_ai_")  # ids every event carries
    ]
    return " · ".join(parts[:5]) or event_type
