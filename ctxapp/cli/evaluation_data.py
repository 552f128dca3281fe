"""The files `ctxapp eval recall` reads: LoCoMo's format, and the dev sets' own
({conversations: [{id, sessions: [{date, turns: [{id, speaker, role?, text}]}], questions: …}]})."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"D(\d+):(\d+)", re.IGNORECASE)


class HarnessError(Exception):
    """The input file or the server is not usable (a message for the command line)."""


@dataclass
class Conversation:
    sample_id: str
    sessions: list[tuple[int, datetime | None, list[dict[str, Any]]]]  # (n, date, turns)
    questions: list[dict[str, Any]]


def parse_date(text: str | None) -> datetime | None:
    """LoCoMo's '1:56 pm on 8 May, 2023' (any case) → an aware UTC datetime; None if unparsable."""
    if not text:
        return None
    cleaned = " ".join(text.strip().split())
    for pattern in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %B %Y", "%d %B, %Y", "%d %B %Y", "%Y-%m-%d"):
        try:
            return datetime.strptime(cleaned.title().replace(" On ", " on "), pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    try:
        parsed = datetime.fromisoformat(cleaned)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def dia_key(dia_id: Any) -> str:
    """A turn's id as the evidence names it: 'D3:05' and 'd3:5' are 'D3:5'; other ids unchanged."""
    text = str(dia_id or "").strip()
    match = _DIA_ID.fullmatch(text)
    return f"D{int(match[1])}:{int(match[2])}" if match else text


def evidence_ids(question: dict[str, Any]) -> set[str]:
    """The turns a question's evidence names, however LoCoMo wrote them (a list, or 'D1:2; D3:4')."""
    found: set[str] = set()
    for item in question.get("evidence") or []:
        named = [dia_key(match[0]) for match in _DIA_ID.finditer(str(item))]
        if named:
            found.update(named)
        elif item:
            found.add(str(item))
    return found


def turn_text(turn: dict[str, Any]) -> str:
    """The turn's words, with the caption of an image it shares (LoCoMo's `blip_caption`)."""
    text = str(turn.get("text") or "")
    caption = str(turn.get("blip_caption") or "").strip()
    return f"{text} [shares a photo: {caption}]".strip() if caption else text


def load(path: str) -> list[Conversation]:
    """Read a LoCoMo-format file, or the dev sets' own format. Raises HarnessError naming what is wrong."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise HarnessError(f"cannot read {path}: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("conversations"), list):
        return _load_dev_format(path, data["conversations"])
    if not isinstance(data, list):
        raise HarnessError(f"{path}: expected a JSON list of samples")
    conversations = []
    for index, sample in enumerate(data):
        if not isinstance(sample, dict) or not isinstance(sample.get("conversation"), dict):
            raise HarnessError(f"{path}: sample {index} has no 'conversation' object")
        conv = sample["conversation"]
        sessions = []
        for key, turns in conv.items():
            match = _SESSION_KEY.match(key)
            if not match or not isinstance(turns, list):
                continue
            number = int(match.group(1))
            sessions.append((number, parse_date(conv.get(f"session_{number}_date_time")), turns))
        sessions.sort(key=lambda item: item[0])
        questions = [q for q in sample.get("qa") or [] if isinstance(q, dict) and q.get("question")]
        conversations.append(
            Conversation(
                sample_id=str(sample.get("sample_id", index)), sessions=sessions, questions=questions
            )
        )
    return conversations


def _load_dev_format(path: str, items: list[Any]) -> list[Conversation]:
    """{conversations: [{id, sessions: [{date, turns: [{id, speaker, text}]}], questions}]}: a
    turn's `id` is what evidence names."""
    conversations = []
    for index, conv in enumerate(items):
        if not isinstance(conv, dict) or not isinstance(conv.get("sessions"), list):
            raise HarnessError(f"{path}: conversation {index} has no 'sessions' list")
        sessions = []
        for number, session in enumerate(conv["sessions"], start=1):
            if not isinstance(session, dict) or not isinstance(session.get("turns"), list):
                raise HarnessError(f"{path}: conversation {index}, session {number} has no 'turns' list")
            turns = [
                {**turn, "dia_id": turn.get("id")} for turn in session["turns"] if isinstance(turn, dict)
            ]
            sessions.append((number, parse_date(session.get("date")), turns))
        questions = [q for q in conv.get("questions") or [] if isinstance(q, dict) and q.get("question")]
        conversations.append(
            Conversation(sample_id=str(conv.get("id", index)), sessions=sessions, questions=questions)
        )
    return conversations
