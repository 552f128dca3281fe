"""Build tests/data/dev/conversations_dev2.locomo.json from locomo_c*.txt, and check LoCoMo-format dev files.

The source is plain text written for ctxapp (CC0): `CONV id | speaker_a | speaker_b`, `S <date>`
(LoCoMo's '8:15 pm on 12 january, 2025'), turns `Name: text {tag}`, and questions
`Q <category> <kind> | question | answer | tag, tag`. Tags name turns, so evidence survives
inserting a turn. For category 5 (adversarial) the answer field is the trap (what is true of the
other speaker or of something nearby); the item gets it as `adversarial_answer`, and `answer`
says it was not mentioned. Categories are LoCoMo's numbers as conversations_dev.locomo.json uses
them: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.

    python tests/data/dev/source/build_locomo.py           # build, then check the result
    python tests/data/dev/source/build_locomo.py --check FILE [FILE ...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "conversations_dev2.locomo.json"
LICENSE = "CC0-1.0; written for ctxapp, no copied prose"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
NOT_MENTIONED = "Not mentioned in the conversation."
NGRAM = 6  # a question may not repeat this many consecutive words of its evidence
MIN_SESSIONS, MIN_TURNS, MIN_QUESTIONS = 10, 16, 40

_TURN = re.compile(r"^([^:|]{1,40}):\s*(.*?)\s*(?:\{([\w-]+)\})?$")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_SESSION = re.compile(r"^session_(\d+)$")


def parse(lines: list[str], origin: str) -> dict[str, Any]:
    """One source file → {id, speakers, sessions: [{date, turns: [(speaker, text, tag)]}], qa}."""
    conv: dict[str, Any] | None = None
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        where = f"{origin}:{number}"
        if not line or line.startswith("#"):
            continue
        if line.startswith("CONV "):
            sample_id, speaker_a, speaker_b = (p.strip() for p in line[5:].split("|"))
            conv = {"id": sample_id, "speakers": (speaker_a, speaker_b), "sessions": [], "qa": []}
        elif conv is None:
            sys.exit(f"{where}: text before the CONV line")
        elif line.startswith("S "):
            conv["sessions"].append({"date": line[2:].strip(), "turns": []})
        elif line.startswith("Q "):
            parts = [p.strip() for p in line[2:].split("|")]
            if len(parts) != 4:
                sys.exit(f"{where}: a question needs 'category kind | question | answer | tags'")
            category, kind = parts[0].split()
            tags = [t.strip() for t in parts[3].split(",") if t.strip()]
            conv["qa"].append((int(category), kind, parts[1], parts[2], tags, where))
        else:
            match = _TURN.match(line)
            if not match or match[1] not in conv["speakers"] or not conv["sessions"]:
                sys.exit(f"{where}: not a turn of {conv['speakers']} inside a session: {line}")
            conv["sessions"][-1]["turns"].append((match[1], match[2], match[3]))
    if conv is None:
        sys.exit(f"{origin}: no CONV line")
    return conv


def build(conv: dict[str, Any]) -> dict[str, Any]:
    speaker_a, speaker_b = conv["speakers"]
    conversation: dict[str, Any] = {"speaker_a": speaker_a, "speaker_b": speaker_b}
    tags: dict[str, str] = {}
    for number, session in enumerate(conv["sessions"], start=1):
        conversation[f"session_{number}_date_time"] = session["date"]
        turns = []
        for seq, (speaker, text, tag) in enumerate(session["turns"], start=1):
            dia_id = f"D{number}:{seq}"
            turns.append({"speaker": speaker, "dia_id": dia_id, "text": text})
            if tag:
                if tag in tags:
                    sys.exit(f"{conv['id']}: tag {tag} used twice")
                tags[tag] = dia_id
        conversation[f"session_{number}"] = turns
    qa = []
    for category, kind, question, answer, qtags, where in conv["qa"]:
        missing = [t for t in qtags if t not in tags]
        if missing:
            sys.exit(f"{where}: unknown tags {missing}")
        item: dict[str, Any] = {"question": question}
        if category == 5:
            item |= {"answer": NOT_MENTIONED, "adversarial_answer": answer}
        else:
            item["answer"] = answer
        item |= {"evidence": [tags[t] for t in qtags], "category": category, "kind": kind}
        qa.append(item)
    return {"sample_id": conv["id"], "license": LICENSE, "conversation": conversation, "qa": qa}


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("\u2019", "'"))


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    tokens = words(text)
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def session_date(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()).title().replace(" On ", " on "), "%I:%M %p on %d %B, %Y")


def problems(samples: list[dict[str, Any]], *, required: set[int]) -> list[str]:
    """Everything wrong with a LoCoMo-format dev file, one line each (empty: it is sound)."""
    out: list[str] = []
    seen_ids: set[str] = set()
    for sample in samples:
        sid = str(sample.get("sample_id"))
        if sid in seen_ids:
            out.append(f"{sid}: sample_id used twice")
        seen_ids.add(sid)
        conv = sample["conversation"]
        speakers = {conv["speaker_a"], conv["speaker_b"]}
        numbers = sorted(int(m[1]) for k in conv if (m := _SESSION.match(k)))
        if numbers != list(range(1, len(numbers) + 1)) or len(numbers) < MIN_SESSIONS:
            out.append(f"{sid}: sessions {numbers} (want 1..N, N >= {MIN_SESSIONS})")
        texts: dict[str, str] = {}
        session_of: dict[str, int] = {}
        previous: datetime | None = None
        for n in numbers:
            try:
                when = session_date(conv[f"session_{n}_date_time"])
            except (KeyError, ValueError):
                out.append(f"{sid}: session {n} has no parsable date")
                continue
            if previous is not None and when <= previous:
                out.append(f"{sid}: session {n} ({when:%Y-%m-%d}) is not after the one before")
            previous = when
            turns = conv[f"session_{n}"]
            spoke = sorted({t["speaker"] for t in turns})
            if len(turns) < MIN_TURNS or set(spoke) != speakers:
                out.append(f"{sid}: session {n} has {len(turns)} turns, speakers {spoke}")
            for seq, turn in enumerate(turns, start=1):
                if turn["dia_id"] != f"D{n}:{seq}":
                    out.append(f"{sid}: turn {turn['dia_id']} where D{n}:{seq} belongs")
                if not str(turn.get("text") or "").strip():
                    out.append(f"{sid}: {turn['dia_id']} is empty")
                texts[turn["dia_id"]] = turn["text"]
                session_of[turn["dia_id"]] = n
        counts: Counter[int] = Counter()
        questions: set[str] = set()
        for qa in sample["qa"]:
            question, category, evidence = qa["question"], qa.get("category"), qa.get("evidence") or []
            counts[category] += 1
            label = f"{sid}: {question!r}"
            if question.casefold() in questions:
                out.append(f"{label} asked twice")
            questions.add(question.casefold())
            if category not in CATEGORIES:
                out.append(f"{label}: category {category!r}")
            if not (qa.get("adversarial_answer") if category == 5 else qa.get("answer")):
                out.append(f"{label}: no {'adversarial_answer' if category == 5 else 'answer'}")
            if not evidence:
                out.append(f"{label}: no evidence")
            unknown = [e for e in evidence if e not in texts]
            if unknown:
                out.append(f"{label}: evidence {unknown} names no turn")
            if category == 1 and len({session_of.get(e) for e in evidence}) < 2:
                out.append(f"{label}: multi-hop evidence within one session")
            for dia_id in evidence:
                shared = ngrams(question) & ngrams(texts.get(dia_id, ""))
                if shared:
                    out.append(f"{label} repeats {' '.join(sorted(shared)[0])!r} from {dia_id}")
        total = sum(counts.values())
        if total < MIN_QUESTIONS:
            out.append(f"{sid}: {total} questions (want >= {MIN_QUESTIONS})")
        for category in sorted(required):
            if counts[category] < max(2, total * 0.04):
                out.append(f"{sid}: {counts[category]} {CATEGORIES[category]} questions of {total}")
        if counts[4] > total * 0.65:
            out.append(f"{sid}: {counts[4]} of {total} questions are single-hop")
    return out


def summary(samples: list[dict[str, Any]]) -> str:
    lines = []
    for sample in samples:
        conv = sample["conversation"]
        sessions = [v for k, v in conv.items() if _SESSION.match(k)]
        counts = Counter(qa["category"] for qa in sample["qa"])
        dates = [session_date(conv[f"session_{n}_date_time"]) for n in range(1, len(sessions) + 1)]
        lines.append(
            f"{sample['sample_id']:>4} {conv['speaker_a']}/{conv['speaker_b']}: {len(sessions)} sessions, "
            f"{sum(map(len, sessions))} turns, {dates[0]:%Y-%m-%d}..{dates[-1]:%Y-%m-%d}, "
            f"{len(sample['qa'])} questions "
            + " ".join(f"{CATEGORIES[c]}={counts[c]}" for c in sorted(counts))
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", nargs="+", metavar="FILE", help="only check these files")
    args = parser.parse_args()
    if args.check:
        paths = [Path(p) for p in args.check]
    else:
        samples = [
            build(parse(path.read_text(encoding="utf-8").splitlines(), path.name))
            for path in sorted(HERE.glob("locomo_c*.txt"))
        ]
        OUT.write_text(json.dumps(samples, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        paths = [OUT]
    failed = False
    for path in paths:
        samples = json.loads(path.read_text(encoding="utf-8"))
        has_adversarial = any(qa.get("category") == 5 for s in samples for qa in s["qa"])
        found = problems(samples, required={1, 2, 3, 4} | ({5} if has_adversarial else set()))
        print(f"{path.name}\n{summary(samples)}")
        for line in found:
            print(f"  problem: {line}")
        failed = failed or bool(found)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
