"""Decay's text matching: a light stemmer, key terms, and the optional embedding similarity.

Pure apart from `embed`, which calls the configured embedder (memory.services.embedding) and
answers None when it is unusable, so decay works on key terms alone.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from dataclasses import dataclass

from memory.models import DecayPolicy, FactReference
from memory.services import embedding

logger = logging.getLogger(__name__)

STOPWORDS = frozenset(
    """
    a about above after again against all also always am an and any are aren as at be because been
    before being below between both but by can cannot could did didn do does doesn doing don down
    during each either else even ever every few for from further get gets got had has hasn have
    haven having he her here hers herself him himself his how however i if in into is isn it its
    itself just let like make may me might more most must my myself need needs never no nor not now
    of off often on once only or other ought our ours ourselves out over own please same shall she
    should shouldn so some such than that the their theirs them themselves then there these they
    this those through thus to too under until up upon us use used using very via was wasn we were
    weren what when where which while who whom why will with within without won would wouldn yes
    yet you your yours yourself yourselves okay ok sure thanks thank one two also really just
    """.split()  # noqa: SIM905 - a word list reads better as text
)
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def _stem(word: str) -> str:
    # A deliberately light stemmer (plurals, -ing, -ed, final -e) so "cache"/"caching"/"caches",
    # "tests"/"testing"/"tested" meet. Both sides of a comparison go through it, so it need
    # not produce real words.
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)] + keep
            break
    if word.endswith("e") and len(word) > 4:
        word = word[:-1]
    return word


def words(text: str) -> list[str]:
    """The distinct content words of `text` in order (lower-cased; stop words, 1-2 letter words out)."""
    normalized = unicodedata.normalize("NFKC", text).lower()
    seen: dict[str, None] = {}
    for word in _WORD.findall(normalized):
        if (len(word) >= 3 or word.isdigit()) and word not in STOPWORDS:
            seen.setdefault(word, None)
    return list(seen)


def key_terms(text: str) -> list[str]:
    """The distinct key terms of `text` in order: its content words, lightly stemmed."""
    return list(dict.fromkeys(_stem(word) for word in words(text)))


def key_phrase(key: str) -> str:
    name = key.rsplit(":", 1)[-1]
    return " ".join(_WORD.findall(name.lower()))


def normalized_text(text: str) -> str:
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).lower()))


@dataclass
class Match:
    method: str
    score: float


def match_terms(
    fact_terms: list[str], message_terms: set[str], policy: DecayPolicy
) -> tuple[Match | None, int]:
    """(a key-terms match or None, number of shared terms that are words, not numbers)."""
    if not fact_terms:
        return None, 0
    shared = sum(1 for term in fact_terms if term in message_terms)
    score = shared / len(fact_terms)
    needed = min(policy.reference_min_terms, len(fact_terms))
    if shared >= max(needed, 1) and score >= policy.reference_term_overlap:
        return Match(FactReference.Method.KEY_TERMS, score), shared
    # A shared number alone ("round 5" vs "goal 5") is no reason to embed the message.
    return None, sum(1 for term in fact_terms if term in message_terms and not term.isdigit())


# --- embeddings (optional) ---------------------------------------------------------------------


def embed(texts: list[str]) -> tuple[list[list[float]], str] | None:
    """Embed `texts` with the configured embedder (memory.services.embedding); None when unusable.

    Kept behind this one function so decay works (key terms only) without an embedder, or while
    an OpenAI-compatible endpoint is down: an append must never fail because of it.
    """
    try:
        embedder = embedding.embedder_get()
        vectors = embedder.embed(texts)
    except Exception:  # best effort here: key terms still work without it
        logger.warning("decay: embedding failed; falling back to key terms only", exc_info=True)
        return None
    return [[float(x) for x in vector] for vector in vectors], str(embedder.model_name)


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0
