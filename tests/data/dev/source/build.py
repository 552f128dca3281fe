"""Build tests/data/dev/user_assistant_dev.json and extraction_labelled.json from ua_part*.txt.

The source is plain text written for ctxapp (CC0): `CONV id | user | assistant`, `S <date>`, turns
`U: text {tag} => subject=value; subject=value` / `A: text {tag}`, and questions
`Q kind | question | answer | tag,tag`. Tags name turns so that evidence survives edits; the
`=> …` labels are the memories a careful reader would take from a user turn. Run:
    python tests/data/dev/source/build.py
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent
HELD_OUT = {"u4", "u5", "u6"}  # the offline rules were written looking only at u1-u3
LICENSE = "CC0-1.0; written for ctxapp, no copied prose"
_TURN = re.compile(r"^(U|A):\s*(.*?)\s*(?:\{(\w+)\})?\s*(?:=>\s*(.*))?$")


def memory_type(subject: str) -> str:
    head = subject.split(".", 1)[0]
    return {
        "preference": "preference",
        "plan": "plan",
        "constraint": "constraint",
        "diet": "constraint",
        "decision": "decision",
        "fact": "fact",
    }.get(head, "profile")


def parse(lines: list[str]) -> list[dict]:
    convs: list[dict] = []
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("CONV "):
            sample_id, user, assistant = (p.strip() for p in line[5:].split("|"))
            convs.append({"id": sample_id, "user": user, "assistant": assistant, "sessions": [], "qa": []})
        elif line.startswith("S "):
            convs[-1]["sessions"].append({"date": line[2:].strip(), "turns": []})
        elif line.startswith("Q "):
            kind, question, answer, tags = (p.strip() for p in line[2:].split("|"))
            convs[-1]["qa"].append((kind, question, answer, [t.strip() for t in tags.split(",")]))
        else:
            match = _TURN.match(line)
            if not match:
                sys.exit(f"cannot read: {line}")
            who, text, tag, labels = match.groups()
            convs[-1]["sessions"][-1]["turns"].append((who, text, tag, labels))
    return convs


def build(convs: list[dict]) -> tuple[list[dict], dict]:
    samples, labelled = [], []
    for conv in convs:
        conversation: dict = {"speaker_a": conv["user"], "speaker_b": conv["assistant"]}
        tags: dict[str, str] = {}
        history: dict[str, list[tuple[str, str]]] = {}
        for number, session in enumerate(conv["sessions"], start=1):
            conversation[f"session_{number}_date_time"] = session["date"]
            turns = []
            for seq, (who, text, tag, labels) in enumerate(session["turns"], start=1):
                dia_id = f"D{number}:{seq}"
                speaker = conv["user"] if who == "U" else conv["assistant"]
                turns.append({"speaker": speaker, "dia_id": dia_id, "text": text})
                if tag:
                    if tag in tags:
                        sys.exit(f"{conv['id']}: tag {tag} used twice")
                    tags[tag] = dia_id
                expected = []
                for label in filter(None, (p.strip() for p in (labels or "").split(";"))):
                    subject, value = (p.strip() for p in label.split("=", 1))
                    expected.append({"subject": subject, "value": value, "type": memory_type(subject)})
                    history.setdefault(subject, []).append((value, dia_id))
                if labels and who != "U":
                    sys.exit(f"{conv['id']} {dia_id}: only user turns carry memories")
                labelled.append(
                    {
                        "sample_id": conv["id"],
                        "split": "held-out" if conv["id"] in HELD_OUT else "rules",
                        "session": number,
                        "date": session["date"],
                        "dia_id": dia_id,
                        "speaker": "user" if who == "U" else "assistant",
                        "text": text,
                        "expected": expected,
                    }
                )
            conversation[f"session_{number}"] = turns
        qa = []
        for kind, question, answer, qtags in conv["qa"]:
            missing = [t for t in qtags if t not in tags]
            if missing:
                sys.exit(f"{conv['id']}: unknown tags {missing} in {question}")
            qa.append(
                {
                    "question": question,
                    "answer": answer,
                    "evidence": [tags[t] for t in qtags],
                    "category": kind,
                    "kind": kind,
                }
            )
        changes = []
        for subject, values in history.items():
            for (old, old_id), (new, new_id) in itertools.pairwise(values):
                if old.casefold() != new.casefold():
                    changes.append(
                        {
                            "subject": subject,
                            "old": old,
                            "new": new,
                            "old_evidence": [old_id],
                            "evidence": [new_id],
                        }
                    )
        samples.append(
            {
                "sample_id": conv["id"],
                "license": LICENSE,
                "split": "held-out" if conv["id"] in HELD_OUT else "rules",
                "conversation": conversation,
                "qa": qa,
                "fact_changes": changes,
            }
        )
    return samples, {"license": LICENSE, "turns": labelled}


def main() -> None:
    lines: list[str] = []
    for part in sorted(HERE.glob("ua_part*.txt")):
        lines.extend(part.read_text(encoding="utf-8").splitlines())
    samples, labelled = build(parse(lines))
    (OUT / "user_assistant_dev.json").write_text(
        json.dumps(samples, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (OUT / "extraction_labelled.json").write_text(
        json.dumps(labelled, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    for sample in samples:
        sessions = sum(1 for k in sample["conversation"] if re.fullmatch(r"session_\d+", k))
        print(
            sample["sample_id"],
            sample["split"],
            f"sessions={sessions}",
            f"questions={len(sample['qa'])}",
            f"changes={len(sample['fact_changes'])}",
        )


if __name__ == "__main__":
    main()
