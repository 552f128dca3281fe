"""The Python examples of docs/integrations.md (OpenTelemetry, LangChain and LangGraph sections) run
as printed, each in its own process, against a live server, and do what the text says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memory.models import Message, Session

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
SECTIONS = ("## OpenTelemetry traces", "## LangChain and LangGraph")


def _examples() -> list[str]:
    text = DOC.read_text()
    blocks = []
    for heading in SECTIONS:
        start = text.index(heading)
        end = text.find("\n## ", start + len(heading))
        section = text[start : end if end != -1 else len(text)]
        blocks += re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return blocks


def _run(code: str, server: str, key: str) -> str:
    env = {**os.environ, "CTXAPP_URL": server, "CTXAPP_API_KEY": key}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_there_is_one_example_per_adapter() -> None:
    examples = _examples()
    assert len(examples) == 5
    for name in (
        "OTLPSpanExporter",
        "CtxappSaver",
        "CtxappStore",
        "CtxappChatMessageHistory",
        "CtxappRetriever",
    ):
        assert sum(name in code for code in examples) == 1, name


@pytest.mark.parametrize("index", range(5))
def test_the_example_runs_as_printed(server: str, alice_key: str, index: int) -> None:
    code = _examples()[index]
    out = _run(code, server, alice_key)
    if "OTLPSpanExporter" in code:
        session = Session.objects.get(agent__external_id="travel-bot")
        assert [(m.role, m.content) for m in Message.objects.filter(session=session).order_by("seq")] == [
            ("user", "A train to Lyon tomorrow?"),
            ("assistant", "The 08:04 has seats."),
        ]
    elif "CtxappSaver" in code:
        assert out.splitlines() == ["('book',)", "['planned', 'booked']"]
    elif "CtxappStore" in code:
        assert out.splitlines() == ["m1 Allergic to peanuts", "[('users', 'u-docs', 'memories')]"]
    elif "CtxappChatMessageHistory" in code:
        lines = out.splitlines()
        assert re.fullmatch(r"sess_\S+ 4", lines[0]), lines
        assert lines[1] == "track"
    else:  # the earlier session's turn and the experience, through memory search
        lines = out.splitlines()
        assert any(re.fullmatch(r"message sess_\S+:1 My parcel 4471 is stuck at customs in Rotterdam\.", x)
                   for x in lines), lines  # fmt: skip
        assert any(x.startswith("experience ") and "Parcel stuck at customs" in x for x in lines), lines
        assert "Solution: Ask the customer for the commercial invoice." in lines
