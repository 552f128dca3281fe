"""The harness reads the original LoCoMo release as well as our dev set: image captions are part of
the turn, and evidence written loosely still names the right turns."""

from __future__ import annotations

import importlib.util
import itertools
import json
from collections import Counter
from pathlib import Path
from types import ModuleType

from ctxapp.cli.evaluation import message_of
from ctxapp.cli.evaluation_data import dia_key, evidence_ids, load, turn_text


def test_evidence_in_every_form_locomo_uses_names_the_same_turns() -> None:
    assert evidence_ids({"evidence": ["D1:3"]}) == {"D1:3"}
    assert evidence_ids({"evidence": ["D8:6; D9:17"]}) == {"D8:6", "D9:17"}
    assert evidence_ids({"evidence": ["D30:05", "d2:1"]}) == {"D30:5", "D2:1"}
    assert evidence_ids({"evidence": []}) == set()
    assert evidence_ids({}) == set()
    assert evidence_ids({"evidence": ["turn-7"]}) == {"turn-7"}  # a non-LoCoMo id is kept as it is


def test_an_image_turn_is_stored_with_its_caption(tmp_path: Path) -> None:
    turn = {
        "speaker": "Caroline",
        "dia_id": "D1:05",
        "text": "Look what I painted last week!",
        "img_url": ["https://example.com/a.jpg"],
        "blip_caption": "a painting of a sunset over a lake",
    }
    shared = "Look what I painted last week! [shares a photo: a painting of a sunset over a lake]"
    assert turn_text(turn) == shared
    assert turn_text({"text": "No picture here."}) == "No picture here."
    sample = [
        {
            "sample_id": "conv-26",
            "conversation": {
                "speaker_a": "Caroline",
                "speaker_b": "Melanie",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": [turn],
            },
            "event_summary": {"events_session_1": {}},
            "observation": {},
            "session_summary": {},
            "qa": [{"question": "What did Caroline paint?", "evidence": ["D1:5"], "category": 1}],
        }
    ]
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(sample))
    [conversation] = load(str(path))
    [(number, when, turns)] = conversation.sessions
    assert (number, when.isoformat() if when else None) == (1, "2023-05-08T13:56:00+00:00")
    message = message_of(turns[0], when)
    assert "a painting of a sunset over a lake" in message["content"]
    assert message["name"] == "Caroline"


DEV = Path(__file__).parent / "data" / "dev"
# LoCoMo's numbers, as the dev files use them: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,
# 5 adversarial. The first file predates adversarial questions.
REQUIRED_CATEGORIES = {
    "conversations_dev.locomo.json": {1, 2, 3, 4},
    "conversations_dev2.locomo.json": {1, 2, 3, 4, 5},
}


def _builder(name: str = "build_locomo") -> ModuleType:
    """tests/data/dev/source/<name>.py, the script that builds a dev file, loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, DEV / "source" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_dev_conversation_reads_with_dated_sessions_and_evidence_that_names_its_turns() -> None:
    assert sorted(p.name for p in DEV.glob("*.locomo.json")) == sorted(REQUIRED_CATEGORIES)
    sample_ids: list[str] = []
    for name, required in REQUIRED_CATEGORIES.items():
        conversations = load(str(DEV / name))
        assert len(conversations) >= 4, name
        for conversation in conversations:
            where = f"{name} {conversation.sample_id}"
            sample_ids.append(conversation.sample_id)
            dates = [when for _, when, _ in conversation.sessions]
            assert len(dates) >= 10 and None not in dates, where
            assert all(a < b for a, b in itertools.pairwise(dates)), where  # type: ignore[operator]
            turns = {dia_key(t["dia_id"]) for _, _, session in conversation.sessions for t in session}
            assert all(len(session) >= 16 for _, _, session in conversation.sessions), where
            categories = Counter(q["category"] for q in conversation.questions)
            assert set(categories) == required, (where, categories)
            assert len(conversation.questions) >= 40, where
            for question in conversation.questions:
                evidence = evidence_ids(question)
                assert evidence and evidence <= turns, (where, question["question"], evidence - turns)
    assert len(sample_ids) == len(set(sample_ids)) >= 12  # pooled runs key results by sample id


def test_the_second_dev_file_is_what_its_source_builds_and_passes_its_checks() -> None:
    builder = _builder()
    sources = sorted((DEV / "source").glob("locomo_c*.txt"))
    built = [
        builder.build(builder.parse(p.read_text(encoding="utf-8").splitlines(), p.name)) for p in sources
    ]
    committed = json.loads((DEV / "conversations_dev2.locomo.json").read_text(encoding="utf-8"))
    assert built == committed, "run tests/data/dev/source/build_locomo.py after editing its source"
    assert builder.problems(committed, required={1, 2, 3, 4, 5}) == []
    # The checks catch what they are for: a question that copies its evidence, a missing turn.
    broken = json.loads(json.dumps(committed[:1]))
    first = broken[0]["qa"][0]
    sessions = [v for k, v in broken[0]["conversation"].items() if isinstance(v, list)]
    turn = next(t for session in sessions for t in session if t["dia_id"] == first["evidence"][0])
    first["question"] = f"Why did they say {turn['text']}?"
    broken[0]["qa"][1]["evidence"] = ["D99:1"]
    found = builder.problems(broken, required={1, 2, 3, 4, 5})
    assert any("repeats" in line for line in found) and any("names no turn" in line for line in found), found


def test_the_haystack_set_is_the_user_assistant_set_among_the_others_sessions_in_the_first_person(
    tmp_path: Path,
) -> None:
    builder = _builder("build_haystack")
    committed = json.loads((DEV / "user_assistant_haystack_dev.json").read_text(encoding="utf-8"))
    assert builder.build() == committed, "run tests/data/dev/source/build_haystack.py"
    source = json.loads((DEV / "user_assistant_dev.json").read_text(encoding="utf-8"))
    every_session = sum(
        1 for s in source for k in s["conversation"] if k.startswith("session_") and "date" not in k
    )
    for original, haystack in zip(source, committed, strict=True):
        name = original["conversation"]["speaker_a"]
        path = tmp_path / f"{haystack['sample_id']}.json"
        path.write_text(json.dumps([haystack]), encoding="utf-8")
        [conversation] = load(str(path))
        turns = {dia_key(t["dia_id"]): t for _, _, session in conversation.sessions for t in session}
        dates = [when for _, when, _ in conversation.sessions]
        assert len(dates) == every_session and dates == sorted(dates)  # type: ignore[type-var]
        assert {t["speaker"] for t in turns.values()} == {"user", "assistant"}
        original_turns = {
            t["dia_id"]: t for k, v in original["conversation"].items() if isinstance(v, list) for t in v
        }
        for before, after in zip(original["qa"], conversation.questions, strict=True):
            assert name not in after["question"], after["question"]
            # The evidence is the same words, wherever the interleaving put them.
            assert [original_turns[e]["text"] for e in before["evidence"]] == [
                turns[e]["text"] for e in after["evidence"]
            ]
    assert builder.first_person("Which city does Maya live in now?", "Maya") == "Which city do I live in now?"
    assert (
        builder.first_person("When did Maya and Jess get engaged?", "Maya")
        == "When did Jess and I get engaged?"
    )
    assert builder.first_person("Is Tomás still on keto?", "Tomás") == "Am I still on keto?"
    assert builder.first_person("What review advice did the assistant give Maya?", "Maya") == (
        "What review advice did the assistant give me?"
    )
