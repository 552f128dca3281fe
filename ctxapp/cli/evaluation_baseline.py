"""`ctxapp eval recall --baseline`: issue 35's plain recipe, computed here beside the server's answers.

The recipe: MiniLM int8 (the wheel ctxapp ships) embeds each turn as `index_text` ("(8 May 2023)
Caroline: …") and the question; Okapi BM25 over lowercase words minus English stop words (no
stemming); both z-scored over every turn of the conversation and fused 0.6 / 0.4; then each turn
adds 0.75 times the best fused score within ±2 turns of its session. Nothing is tuned, nothing is
read from the server: it is the floor ctxapp's ranking has to beat on the same file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from memory.services import ranking


@dataclass(frozen=True)
class BaselineTurn:
    dia: str  # the turn's id as evidence names it
    session: str
    position: int
    speaker: str
    text: str  # ranking.index_text


def _embedder() -> object:
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    import django  # lazy: django-setup
    from django.conf import settings  # lazy: django-setup

    if not settings.configured or not django.apps.apps.ready:
        django.setup()
    from memory.services.embedding import MiniLMEmbedder  # lazy: django-setup

    return MiniLMEmbedder(threads=1)


class RecipeBaseline:
    """One conversation's turns, embedded once; `ranked(question)` → the turns' ids, best first."""

    def __init__(self, turns: list[BaselineTurn], *, embedder: object | None = None) -> None:
        self.turns = turns
        self._model = embedder or _embedder()
        self._vectors = self._embed([t.text for t in turns])

    def _embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._model.embed(texts), dtype=np.float32)  # type: ignore[attr-defined]

    def ranked(self, question: str) -> list[str]:
        vector = self._embed([question])[0]
        cosines = (self._vectors @ vector).tolist()
        candidates = [
            ranking.Candidate(
                key=t.dia, kind="message", text=t.text, group=t.session, position=t.position,
                occurred_at=None, dense=cos, speaker=t.speaker,
            )
            for t, cos in zip(self.turns, cosines, strict=True)
        ]  # fmt: skip
        return [
            r.candidate.key
            for r in ranking.rank(query=question, candidates=candidates, plan=ranking.RECIPE_PLAN)
        ]


def baseline_turn(
    *, dia: str, session: str, position: int, speaker: str, text: str, when: datetime | None
) -> BaselineTurn:
    return BaselineTurn(
        dia=dia, session=session, position=position, speaker=speaker,
        text=ranking.index_text(content=text, speaker=speaker or None, occurred_at=when),
    )  # fmt: skip
