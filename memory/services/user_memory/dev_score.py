"""Scoring extraction against a labelled sample (tests/data/dev/extraction_labelled.json).

Replays dev conversations through the real append and extraction paths, so it lives beside the
extractor rather than in it: it needs the session services, which the extractor's own callers
(the append path) import.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from memory.models import MessageRole, Tenant, UserMemory
from memory.services.sessions import MessageInput, messages_append, session_open
from memory.services.user_memory.extraction import Candidate, session_memories_extract
from memory.services.user_memory.store import memories_of

_SCORE_STOP = {
    "a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "and", "or", "my", "our", "is",
    "be", "as", "not", "loves", "love", "likes", "like", "prefers", "prefer", "dislikes", "hates",
    "wants", "answers", "plan", "lives", "works", "has", "called", "diet", "partner", "relationship",
}  # fmt: skip


def value_tokens(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.casefold()) if w not in _SCORE_STOP}


def _stem(word: str) -> str:
    for suffix, replace in (("ies", "y"), ("ing", ""), ("es", ""), ("ed", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + replace
            break
    return word[:-1] if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiou" else word


def _token_in(token: str, words: set[str]) -> bool:
    if _stem(token) in {_stem(w) for w in words}:
        return True
    return any(
        token == w or (min(len(token), len(w)) >= 4 and (w.startswith(token) or token.startswith(w)))
        for w in words
    )


def holds_value(text: str, value: str) -> bool:
    """Whether a memory's text states `value` (every content word of it, plural or not)."""
    words = value_tokens(text)
    wanted = value_tokens(value)
    return bool(wanted) and all(_token_in(token, words) for token in wanted)


def subjects_match(extracted: str, expected: str) -> bool:
    """The same subject; for preferences and plans any topic name (their topic is free text)."""
    if extracted == expected:
        return True
    for family in ("preference.", "plan.", "decision."):
        if extracted.startswith(family) and expected.startswith(family):
            return True
    return False


def candidate_correct(candidate: Candidate, expected: list[dict[str, Any]]) -> bool:
    return any(
        subjects_match(candidate.subject, e["subject"]) and holds_value(candidate.text, e["value"])
        for e in expected
    )


@dataclass
class DevScore:
    """Extraction measured on a dev set: precision of what was extracted, and the share of fact
    changes after which the current view holds the new value and not the old one."""

    extracted: int = 0
    correct: int = 0
    changes: int = 0
    changes_held: int = 0
    labels: int = 0  # labelled memories of the turns replayed
    labels_found: int = 0  # of which a new memory from the same turn states the value
    wrong: list[str] = field(default_factory=list)
    missed_changes: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return 100.0 * self.correct / self.extracted if self.extracted else 0.0

    @property
    def change_accuracy(self) -> float:
        return 100.0 * self.changes_held / self.changes if self.changes else 0.0


def dev_set_score(
    *, tenant: Tenant, samples: list[dict[str, Any]], labelled: list[dict[str, Any]], agent: str = "dev"
) -> DevScore:
    """Replay each sample's sessions (a fresh user per sample, one session per conversation
    session, turns a second apart from the session's date), extract after each session as the job
    would, and score against the labels. Writes real rows in `tenant`."""
    parse_date = _session_date
    labels = {(t["sample_id"], t["dia_id"]): t["expected"] for t in labelled}
    score = DevScore()
    for sample in samples:
        sid, conv = sample["sample_id"], sample["conversation"]
        user_id = f"{agent}-{sid}-{uuid.uuid4().hex[:6]}"
        dia_at: dict[str, datetime] = {}
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        for number in numbers:
            start = parse_date(conv[f"session_{number}_date_time"])
            session, _ = session_open(tenant=tenant, agent_external_id=agent, user_id=user_id)
            items = []
            for index, turn in enumerate(conv[f"session_{number}"]):
                at = start + timedelta(seconds=index)
                dia_at[turn["dia_id"]] = at
                role = MessageRole.USER if turn["speaker"] == conv["speaker_a"] else MessageRole.ASSISTANT
                items.append(MessageInput(role=role, content=turn["text"], occurred_at=at))
            messages = messages_append(tenant=tenant, session=session, items=items)
            dia_of = {
                m.seq: turn["dia_id"] for m, turn in zip(messages, conv[f"session_{number}"], strict=True)
            }
            before = set(
                UserMemory.objects.filter(tenant=tenant, user_id=user_id).values_list("pk", flat=True)
            )
            session_memories_extract(session=session)
            new = list(UserMemory.objects.filter(tenant=tenant, user_id=user_id).exclude(pk__in=before))
            for seq, dia_id in dia_of.items():
                said = [m for m in new if m.sources[0]["seq"] == seq]
                for label in labels.get((sid, dia_id), []):
                    score.labels += 1
                    score.labels_found += any(
                        subjects_match(m.subject, label["subject"]) and holds_value(m.text, label["value"])
                        for m in said
                    )
            for memory in new:
                seq = memory.sources[0]["seq"]
                candidate = Candidate(memory.subject, memory.text, memory.memory_type, seq, memory.confidence)
                score.extracted += 1
                if candidate_correct(candidate, labels.get((sid, dia_of[seq]), [])):
                    score.correct += 1
                else:
                    score.wrong.append(f"{sid} {dia_of[seq]} {memory.subject}: {memory.text}")
        for change in sample.get("fact_changes", []):
            as_of = dia_at[change["evidence"][0]] + timedelta(milliseconds=500)
            view = [m.text for m in memories_of(tenant=tenant, user_id=user_id, as_of=as_of)]
            new_held = any(holds_value(text, change["new"]) for text in view)
            old_held = any(holds_value(t, change["old"]) and not holds_value(t, change["new"]) for t in view)
            score.changes += 1
            if new_held and not old_held:
                score.changes_held += 1
            else:
                score.missed_changes.append(f"{sid} {change['subject']}: {change['old']} -> {change['new']}")
    return score


def _session_date(text: str) -> datetime:
    cleaned = " ".join(text.split()).title().replace(" On ", " on ")
    return datetime.strptime(cleaned, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
