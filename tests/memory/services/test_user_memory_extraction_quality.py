"""Extraction-QUALITY FLOORS (marker `quality`) on the repository's user-assistant dev set
(tests/data/dev/user_assistant_dev.json) and its turn-by-turn labels (extraction_labelled.json).

Replayed through real sessions and the extraction job's own service: at least 90 % of the
memories extracted are correct, and after a fact changes the current view holds only the new
value for at least 95 % of the changes. The offline rules were written on u1-u3 and then widened
after a first look at u4-u6 (docs/memory.md, "Extraction", gives both figures), so every
conversation is now in-sample for the rules; the floors guard against regressions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory.services.user_memory.dev_score import dev_set_score

DEV = Path(__file__).resolve().parents[2] / "data" / "dev"


@pytest.mark.quality
@pytest.mark.django_db
def test_extraction_floors_on_the_user_assistant_dev_set(tenant_a):
    samples = json.loads((DEV / "user_assistant_dev.json").read_text(encoding="utf-8"))
    labelled = json.loads((DEV / "extraction_labelled.json").read_text(encoding="utf-8"))["turns"]
    assert len(samples) >= 6 and sum(len(s["fact_changes"]) for s in samples) >= 30
    score = dev_set_score(tenant=tenant_a, samples=samples, labelled=labelled)
    assert score.extracted >= 80, score
    assert score.precision >= 90.0, score.wrong
    assert score.change_accuracy >= 95.0, score.missed_changes
