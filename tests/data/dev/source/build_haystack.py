"""Build tests/data/dev/user_assistant_haystack_dev.json from user_assistant_dev.json.

The user-assistant dev set is easy in two ways a real assistant's memory is not: each
conversation is ~50 turns (the search pool holds all of it), and every question names the user
("Which city does Maya live in now?"), whose name is also every one of their turns' speaker. A
deployed assistant's log is one user's many sessions on many topics, its turns spoken by `user`
and `assistant`, and its questions in the first person ("Which city do I live in now?").

This variant keeps every question and its evidence and changes only that:
- each conversation's sessions are interleaved, by date, with every session of the other five
  conversations (a haystack of ~300 turns from 49 sessions, other lives' moves, jobs and pets
  among them, as in a long-memory benchmark's haystack);
- the speakers become `user` and `assistant`;
- the questions are put in the first person by a few fixed rules (`first_person`), the same for
  every conversation, written before any figure was taken on this file.

    python tests/data/dev/source/build_haystack.py
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent
SOURCE = OUT / "user_assistant_dev.json"
TARGET = OUT / "user_assistant_haystack_dev.json"
_SESSION = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"D(\d+):(\d+)")


def first_person(question: str, name: str) -> str:
    """'Which city does Maya live in now?' → 'Which city do I live in now?'."""
    n = re.escape(name)
    rules = [
        (rf"\b(?:does|do) {n} and (\w+)", r"do \1 and I"),
        (rf"\bdid {n} and (\w+)", r"did \1 and I"),
        (rf"\b{n} and (\w+)", r"\1 and I"),
        (rf"\b{n}'s\b", "my"),
        (rf"\b(?:does|do) {n}\b", "do I"),
        (rf"\bdid {n}\b", "did I"),
        (rf"\bis {n}\b", "am I"),
        (rf"\bwas {n}\b", "was I"),
        (rf"\bhas {n}\b", "have I"),
        (rf"\band {n}\b", "and I"),
        (
            rf"\b(give|gave|tell|told|suggest|recommend|advise|ask|asked|remind|help|warn)(s|ed)? {n}\b",
            r"\1\2 me",
        ),
        (rf"\b(to|for|with|about) {n}\b", r"\1 me"),
        (rf"\b{n} (is|was|has)\b", lambda m: {"is": "I am", "was": "I was", "has": "I have"}[m[1]]),
        (rf"\b{n}\b", "I"),
    ]
    out = question
    for pattern, replacement in rules:
        out = re.sub(pattern, replacement, out, flags=re.IGNORECASE)
    return out[0].upper() + out[1:] if out else out


def sessions_of(conversation: dict) -> list[tuple[str, list[dict]]]:
    numbers = sorted(int(m[1]) for key in conversation if (m := _SESSION.match(key)))
    return [(conversation[f"session_{n}_date_time"], conversation[f"session_{n}"]) for n in numbers]


def sort_key(date_time: str) -> tuple[int, int, int, int]:
    from datetime import datetime

    parsed = datetime.strptime(date_time.title().replace(" On ", " on "), "%I:%M %p on %d %B, %Y")
    return (parsed.year, parsed.month, parsed.day, parsed.hour * 60 + parsed.minute)


def build() -> list[dict]:
    samples = json.loads(SOURCE.read_text(encoding="utf-8"))
    out = []
    for sample in samples:
        conv = sample["conversation"]
        name = conv["speaker_a"]
        own = [(date, turns, True) for date, turns in sessions_of(conv)]
        others = [
            (date, turns, False)
            for other in samples
            if other is not sample
            for date, turns in sessions_of(other["conversation"])
        ]
        merged = sorted(own + others, key=lambda item: sort_key(item[0]))
        new_conv: dict = {"speaker_a": "user", "speaker_b": "assistant"}
        renumber: dict[str, str] = {}
        for number, (date, turns, is_own) in enumerate(merged, start=1):
            new_conv[f"session_{number}_date_time"] = date
            new_turns = []
            for position, turn in enumerate(turns, start=1):
                new_id = f"D{number}:{position}"
                if is_own:
                    renumber[turn["dia_id"]] = new_id
                speaker = "assistant" if turn["speaker"].lower() == "assistant" else "user"
                new_turns.append({"speaker": speaker, "dia_id": new_id, "text": turn["text"]})
            new_conv[f"session_{number}"] = new_turns
        qa = []
        for q in sample["qa"]:
            evidence = [renumber[e] for e in q["evidence"]]
            qa.append({**q, "question": first_person(q["question"], name), "evidence": evidence})
        out.append(
            {
                "sample_id": f"{sample['sample_id']}-haystack",
                "license": sample.get("license", ""),
                "split": sample.get("split", ""),
                "conversation": new_conv,
                "qa": qa,
            }
        )
    return out


def main() -> None:
    data = build()
    TARGET.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    questions = sum(len(s["qa"]) for s in data)
    turns = sum(len(v) for s in data for k, v in s["conversation"].items() if _SESSION.match(k)) // len(data)
    print(f"wrote {TARGET.name}: {len(data)} conversations, ~{turns} turns each, {questions} questions")


if __name__ == "__main__":
    main()
