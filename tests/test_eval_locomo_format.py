"""The harness reads the original LoCoMo release as well as our dev set: image captions are part of
the turn, and evidence written loosely still names the right turns."""

from __future__ import annotations

import json
from pathlib import Path

from ctxapp.cli.evaluation import message_of
from ctxapp.cli.evaluation_data import evidence_ids, load, turn_text


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
