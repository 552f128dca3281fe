"""Ranking of memory search candidates: the plain recipe plus the components that earned a place.
Pure: no ORM, no I/O.

The caller (memory search, and bench/bench_recall_components.py offline) gathers a pool of
candidates; `rank` scores and orders them. One function for every kind (messages, summaries,
facts, experiences, user memories): one score scale.

THE RECIPE (issue 35; docs/memory.md, "The ranker"), over the pool:

    fused = dense_weight · z(cosine) + lexical_weight · z(BM25)         (z: z-score over the pool)
    score = fused + neighbour_weight · max(0, best fused of the same session within ±radius)

- cosine: the query's MiniLM vector against the row's (a message's `index_text`);
- BM25: Okapi (k1 1.2, b 0.75) over `tokenize`: lowercase `[a-z0-9]+` words minus PostgreSQL's
  English stop words, Snowball-stemmed as PostgreSQL's `english` configuration stems them (so the
  query, the ranker and the GIN index see the same terms). Statistics (rows, mean length, document
  frequency) are taken over the pool itself: no per-scope statistics to keep or estimate.
- window BM25 (`window_radius`): a turn's BM25 document is its own text plus the text of its
  same-session neighbours within ±radius, at full weight. The caller supplies those neighbours'
  text (`Candidate.window`, built with `window_text`).

Components beyond the recipe are on by default only where nested leave-one-conversation-out
showed a held-out gain (docs/memory.md, "The ranker", has the table): Snowball stemming and the
length prior are; window BM25, speaker match, date match, the current-state cue and min-max
fusion are plan options, off.

WHAT THE CALLER MUST SUPPLY: every candidate's `dense` cosine (None: no vector; it takes the
pool's lowest), `text` (for messages `index_text(...)`, the string that was embedded), `group`
and `position` (session and seq, for neighbours), `speaker`, `occurred_at`, and for messages
under a plan with `window_radius` > 0 the `window` text. Duplicates (same `key`) removed.
"""

from __future__ import annotations

import calendar
import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import date, datetime
from functools import lru_cache
from typing import Any

import numpy as np
import Stemmer

# The candidate pool memory search gathers (memory_search/candidates.py) and the offline
# evaluation reproduces: the best POOL_DENSE rows by cosine, the best POOL_LEXICAL by full text,
# and the turns within ±POOL_NEIGHBOURS of the best POOL_NEIGHBOUR_SEEDS of each list. A cost
# knob: 50 / 50 / 15 (~115 candidates on the LoCoMo-style dev set) gave R@5 63.7, R@10 75.4 and
# 87.3 / 94.0, against 63.3 / 75.0 and 87.3 / 94.0 with 100 / 100 / 30 (~173), for a third less
# CPU per search; 30 / 30 / 10: 64.8 / 75.8 (not taken: a gain within noise, on short dev
# conversations, is no reason to risk longer ones).
POOL_DENSE = 50
POOL_LEXICAL = 50
POOL_NEIGHBOUR_SEEDS = 15
POOL_NEIGHBOURS = 2

# PostgreSQL's English stop words (share/tsearch_data/english.stop, the Snowball list its
# `english` configuration drops), so `tokenize` drops what the GIN index never holds.
_STOPWORD_TEXT = """
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her
hers herself it its itself they them their theirs themselves what which who whom this that these
those am is are was were be been being have has had having do does did doing a an the and but if or
because as until while of at by for with about against between into through during before after
above below to from up down in out on off over under again further then once here there when where
why how all any both each few more most other some such no nor not only own same so than too very s
t can will just don should now
"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

_WORD = re.compile(r"[a-z0-9]+")
_CURRENT_CUE = re.compile(
    r"\b(now|nowadays|current|currently|latest|still|anymore|these days|most recent|recently)\b",
    re.IGNORECASE,
)
FUSIONS = ("zscore", "minmax")
_MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")

_stemmers = threading.local()  # a PyStemmer object is not safe to share between threads


@lru_cache(maxsize=262144)
def _stem(word: str) -> str:
    stemmer = getattr(_stemmers, "english", None)
    if stemmer is None:
        stemmer = _stemmers.english = Stemmer.Stemmer("english")
    return str(stemmer.stemWord(word))


def words(text: str) -> tuple[str, ...]:
    """Lowercase `[a-z0-9]+` words minus the stop words, unstemmed (the plain recipe's tokens)."""
    return _words(text)


@lru_cache(maxsize=65536)
def _words(text: str) -> tuple[str, ...]:
    return tuple(w for w in _WORD.findall(text.lower()) if w not in STOPWORDS)


def tokenize(text: str, *, stem: bool = True) -> list[str]:
    """BM25's terms: `words`, Snowball-stemmed (the English stemmer PostgreSQL uses) unless `stem`
    is False."""
    return list(_tokens(text, stem))


@lru_cache(maxsize=131072)
def _tokens(text: str, stem: bool) -> tuple[str, ...]:
    found = _words(text)
    return tuple(_stem(w) for w in found) if stem else found


@lru_cache(maxsize=131072)
def _term_counts(text: str, stem: bool) -> Counter[str]:
    return Counter(_tokens(text, stem))


def messages_prepare(texts: Iterable[str], *, stem: bool = True) -> None:
    """Tokenise `texts` ahead of `rank` (cached per process), for a caller with time to spare,
    e.g. while the query embedding is computed."""
    for text in texts:
        _term_counts(text, stem)


def asks_current_state(query: str) -> bool:
    """Whether the query asks how things stand now ('now', 'currently', 'still', 'latest', ...)."""
    return _CURRENT_CUE.search(query) is not None


def index_text(*, content: str, speaker: str | None, occurred_at: datetime | None) -> str:
    """The text embedded and searched for a message: '(8 May 2023) Caroline: content'."""
    prefix = ""
    if occurred_at is not None:
        prefix = _date_prefix(occurred_at.year, occurred_at.month, occurred_at.day)
    if speaker:
        prefix += f"{speaker}: "
    return f"{prefix}{content}"


@lru_cache(maxsize=8192)
def _date_prefix(year: int, month: int, day: int) -> str:
    # strftime costs ~4 µs a call: ~1 ms for a few hundred candidates.
    return f"({day} {date(year, month, day).strftime('%B %Y')}) "


# What `index_text` puts before a message's content: the date, then the speaker.
INDEX_PREFIX = re.compile(r"^(?:\(\d{1,2} [A-Z][a-z]+ \d{4}\) )?(?:[^:\n]{1,80}: )?")


def window_text(texts: Sequence[str]) -> str:
    """A turn's neighbours' text for window BM25: their `speaker: content` (each `index_text`
    without its date, which the turn's own text carries once), joined."""
    return " ".join(_undated(t) for t in texts)


def _undated(text: str) -> str:
    return re.sub(r"^\(\d{1,2} [A-Z][a-z]+ \d{4}\) ", "", text)


def content_length(*, kind: str, text: str) -> int:
    """The number of stemmed terms of a row's own words: for a message, its `index_text` without
    the date and speaker prefix (the same for every turn, so no information)."""
    return _content_length(kind, text)


@lru_cache(maxsize=65536)
def _content_length(kind: str, text: str) -> int:
    count = len(_tokens(text, True))
    if kind == "message":
        prefix = INDEX_PREFIX.match(text)
        if prefix is not None and prefix.end():
            count -= len(_tokens(prefix.group(), True))
    return count


@dataclass
class Candidate:
    key: str  # unique in the pool, e.g. "message:123"
    kind: str  # "message" | "summary" | "fact" | "experience" | "user_memory"
    text: str  # the searchable text (index_text for messages)
    group: str | None  # session public id, for neighbour smoothing (None: no neighbours)
    position: int | None  # seq inside the group
    occurred_at: datetime | None
    dense: float | None  # cosine query↔candidate; None when the row has no vector
    speaker: str = ""  # a message's speaker (its `name`)
    window: str = ""  # window BM25: the neighbours' text (`window_text`), for messages


@dataclass(frozen=True)
class Plan:
    """Every knob of the ranking. The defaults: the plain recipe plus what nested
    leave-one-conversation-out kept (docs/memory.md, "The ranker")."""

    dense_weight: float = 0.6
    lexical_weight: float = 0.4
    fusion: str = "zscore"  # how each signal is normalised over the pool: zscore | minmax
    k1: float = 1.2
    b: float = 0.75
    stem: bool = True  # Snowball-stem BM25's terms (False: the plain recipe's bare words)
    window_radius: int = 0  # window BM25: a turn's document takes its neighbours within ±this
    neighbour_weight: float = 0.75  # adds w · the best fused score within ±radius in the group
    neighbour_radius: int = 2
    speaker_weight: float = 0.0  # adds w (z units) to turns by a speaker the query names
    date_weight: float = 0.0  # adds w to turns of the month / year the query names
    # When the query asks for the current state ("where does she live now?"), adds
    # w · 2^(-age / half-life) with age from the newest candidate.
    current_cue_weight: float = 0.0
    recency_half_life_days: float = 90.0
    # Informativeness prior: adds w · n / (n + length_saturation), n = the row's own terms.
    length_weight: float = 1.0
    length_saturation: float = 4.0

    _RANGES = {
        "dense_weight": (0.0, 10.0),
        "lexical_weight": (0.0, 10.0),
        "k1": (0.0, 5.0),
        "b": (0.0, 1.0),
        "window_radius": (0, 5),
        "neighbour_weight": (0.0, 5.0),
        "neighbour_radius": (0, 5),
        "speaker_weight": (0.0, 5.0),
        "date_weight": (0.0, 5.0),
        "current_cue_weight": (0.0, 5.0),
        "recency_half_life_days": (0.001, 36500.0),
        "length_weight": (0.0, 5.0),
        "length_saturation": (0.1, 1000.0),
    }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Plan:
        """Defaults overridden by `data`. Raises ValueError naming an unknown or out-of-range field."""
        if not data:
            return cls()
        names = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in data.items():
            if name not in names:
                raise ValueError(f"{name}: unknown plan field (known: {', '.join(sorted(names))}).")
            if name == "fusion":
                if value not in FUSIONS:
                    raise ValueError(f"fusion: must be one of {', '.join(FUSIONS)}, not {value!r}.")
                values[name] = value
                continue
            if name == "stem":
                if not isinstance(value, bool):
                    raise ValueError("stem: must be true or false.")
                values[name] = value
                continue
            low, high = cls._RANGES[name]
            is_int = isinstance(low, int)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}: must be a number.")
            if is_int and not float(value).is_integer():
                raise ValueError(f"{name}: must be an integer.")
            if not (low <= value <= high) or (isinstance(value, float) and math.isnan(value)):
                raise ValueError(f"{name}: must be between {low} and {high}, not {value}.")
            values[name] = int(value) if is_int else float(value)
        return cls(**values)


DEFAULT_PLAN = Plan()
# The plain recipe of issue 35, nothing added: what `ctxapp eval recall --baseline` compares with.
RECIPE_PLAN = Plan(stem=False, length_weight=0.0)
# Distilled experiences alone (problem/solution texts): dense-led; the small lexical share keeps
# rows without a vector (pending) and exact error strings findable (docs/experiences.md).
EXPERIENCE_PLAN = Plan(dense_weight=0.95, lexical_weight=0.05, neighbour_weight=0.0, length_weight=0.0)


PART_NAMES = ("dense", "lexical", "speaker", "date", "neighbour", "recency", "length")


class Ranked:
    """A candidate, its score and each signal's contribution (they add up to the score). The
    contributions are gathered when first read: a search reads them for the few hits it keeps."""

    __slots__ = ("_contributions", "_index", "_parts", "candidate", "score")

    def __init__(self, *, candidate: Candidate, score: float, parts: np.ndarray, index: int) -> None:
        self.candidate = candidate
        self.score = score
        self._parts = parts  # (len(PART_NAMES), candidates), shared by the whole ranking
        self._index = index
        self._contributions: dict[str, float] | None = None

    @property
    def contributions(self) -> dict[str, float]:
        if self._contributions is None:
            values = [round(float(v), 6) + 0.0 for v in self._parts[:, self._index]]  # + 0.0: no -0.0
            self._contributions = dict(zip(PART_NAMES, values, strict=True))
        return self._contributions

    def __repr__(self) -> str:
        return f"Ranked({self.candidate.key!r}, score={self.score}, contributions={self.contributions})"


def bm25_pool(
    *, query: str, documents: Sequence[str], stem: bool = True, k1: float = 1.2, b: float = 0.75
) -> np.ndarray:
    """Okapi BM25 of each document for the query, with the statistics (rows, mean length,
    document frequency) of `documents` themselves: the pool, or a whole scope when it is the pool."""
    scores = np.zeros(len(documents), dtype=np.float64)
    weights = Counter(_tokens(query, stem))
    if not weights or not documents:
        return scores
    docs = [_term_counts(d, stem) for d in documents]
    lengths = np.array([sum(d.values()) for d in docs], dtype=np.float64)
    mean = float(lengths.mean()) or 1.0
    norm = k1 * (1.0 - b + b * lengths / mean)
    n = len(docs)
    for term, weight in weights.items():
        tf = np.array([d.get(term, 0) for d in docs], dtype=np.float64)
        df = int(np.count_nonzero(tf))
        if not df:
            continue
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        scores += weight * idf * tf * (k1 + 1.0) / (tf + norm)
    return scores


def _normalise(values: np.ndarray, fusion: str) -> np.ndarray:
    if fusion == "minmax":
        low, high = (values.min(), values.max()) if len(values) else (0.0, 0.0)
        return (values - low) / (high - low) if high > low else np.zeros_like(values)
    std = values.std() if len(values) else 0.0
    return (values - values.mean()) / std if std > 0 else np.zeros_like(values)


def rank(*, query: str, candidates: list[Candidate], plan: Plan) -> list[Ranked]:
    """Score every candidate for `query` under `plan`; best first (ties: pool order).

    score = dense_weight · z(cosine) + lexical_weight · z(BM25)       (fused, z over the pool)
            + speaker_weight   if the query names the turn's speaker (first name)
            + date_weight      if the turn is of the month / year the query names
            + neighbour_weight · max(0, best fused of the same group within ±neighbour_radius)
            + current_cue_weight · 2^(-days before the newest candidate / half-life), only when
              the query asks for the current state
            + length_weight · n / (n + length_saturation), n = the row's own terms
    A candidate without a vector takes the pool's lowest cosine. `contributions` holds each term.
    """
    if not candidates:
        return []
    dense_part, lexical_part = _fused_parts(query=query, candidates=candidates, plan=plan)
    speaker_part = _speaker_part(query, candidates, plan)
    date_part = _date_part(query, candidates, plan)
    fused = dense_part + lexical_part + speaker_part + date_part
    neighbour_part = _neighbour_part(candidates, fused, plan)
    recency_part = _recency_part(query, candidates, plan)
    length_part = _length_part(candidates, plan)

    parts = np.vstack(
        (dense_part, lexical_part, speaker_part, date_part, neighbour_part, recency_part, length_part)
    )  # in PART_NAMES order
    scores = np.round(parts.sum(axis=0), 6) + 0.0
    order = np.argsort(-scores, kind="stable")
    values = scores.tolist()
    return [Ranked(candidate=candidates[i], score=values[i], parts=parts, index=i) for i in order.tolist()]


def _fused_parts(*, query: str, candidates: list[Candidate], plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """The dense and lexical terms, each normalised over the pool and weighted."""
    dense_raw = [c.dense for c in candidates]
    known = [d for d in dense_raw if d is not None]
    dense_part = np.zeros(len(candidates))
    if known and plan.dense_weight > 0:
        floor = min(known)
        dense = np.array([floor if d is None else d for d in dense_raw], dtype=np.float64)
        dense_part = plan.dense_weight * _normalise(dense, plan.fusion)
    lexical_part = np.zeros(len(candidates))
    if plan.lexical_weight > 0:
        if plan.window_radius > 0:
            documents = [f"{c.text} {c.window}" if c.window else c.text for c in candidates]
        else:
            documents = [c.text for c in candidates]
        lexical = bm25_pool(query=query, documents=documents, stem=plan.stem, k1=plan.k1, b=plan.b)
        lexical_part = plan.lexical_weight * _normalise(lexical, plan.fusion)
    return dense_part, lexical_part


@lru_cache(maxsize=4096)
def _query_names(query: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", query.lower()))


def _speaker_part(query: str, candidates: list[Candidate], plan: Plan) -> np.ndarray:
    """speaker_weight for each turn whose speaker the query names by first name."""
    part = np.zeros(len(candidates))
    if plan.speaker_weight <= 0:
        return part
    named = _query_names(query)
    for i, c in enumerate(candidates):
        first = c.speaker.split()[0].lower() if c.speaker.strip() else ""
        if first and first in named:
            part[i] = plan.speaker_weight
    return part


def query_dates(query: str) -> tuple[int | None, int | None]:
    """(year, month) the query names, e.g. 'in May 2023' → (2023, 5); None for what it does not."""
    lowered = query.lower()
    year_match = _YEAR.search(lowered)
    month = next((number for name, number in _MONTHS.items() if re.search(rf"\b{name}\b", lowered)), None)
    if month == 5 and not year_match and not re.search(r"\bin may\b|\bmay \d", lowered):
        month = None  # "may" the verb
    return (int(year_match.group(1)) if year_match else None), month


def _date_part(query: str, candidates: list[Candidate], plan: Plan) -> np.ndarray:
    """date_weight for each row of the month (and year) or the year the query names."""
    part = np.zeros(len(candidates))
    if plan.date_weight <= 0:
        return part
    year, month = query_dates(query)
    if year is None and month is None:
        return part
    for i, c in enumerate(candidates):
        when = c.occurred_at
        if when is None:
            continue
        if (year is None or when.year == year) and (month is None or when.month == month):
            part[i] = plan.date_weight
    return part


def _neighbour_part(candidates: list[Candidate], fused: np.ndarray, plan: Plan) -> np.ndarray:
    """Each turn's share of the best fused score (at least 0) among its group's turns within the
    radius: turns keyed by (group, position) in one sorted array, each offset a binary search."""
    part = np.zeros(len(candidates))
    if plan.neighbour_weight <= 0 or plan.neighbour_radius <= 0:
        return part
    codes: dict[str, int] = {}
    members = [
        (i, codes.setdefault(c.group, len(codes)), c.position)
        for i, c in enumerate(candidates)
        if c.group is not None and c.position is not None
    ]
    if not members:
        return part
    at = np.array([m[0] for m in members], dtype=np.int64)
    keys = (np.array([m[1] for m in members], dtype=np.int64) << 40) + np.array(
        [m[2] for m in members], dtype=np.int64
    )
    order = np.argsort(keys, kind="stable")
    keys, at = keys[order], at[order]
    scores = fused[at]
    best = np.zeros(len(keys))
    for offset in range(1, plan.neighbour_radius + 1):
        for target in (keys - offset, keys + offset):
            where = np.minimum(np.searchsorted(keys, target), len(keys) - 1)
            best = np.maximum(best, np.where(keys[where] == target, scores[where], 0.0))
    part[at] = plan.neighbour_weight * best
    return part


def _recency_part(query: str, candidates: list[Candidate], plan: Plan) -> np.ndarray:
    """The current-state cue, relative to the newest candidate."""
    part = np.zeros(len(candidates))
    if plan.current_cue_weight <= 0 or not asks_current_state(query):
        return part
    dated = [c.occurred_at for c in candidates if c.occurred_at is not None]
    if not dated:
        return part
    newest = max(dated)
    for i, c in enumerate(candidates):
        if c.occurred_at is not None:
            age_days = max(0.0, (newest - c.occurred_at).total_seconds() / 86400.0)
            part[i] = plan.current_cue_weight * 2.0 ** (-age_days / plan.recency_half_life_days)
    return part


def _length_part(candidates: list[Candidate], plan: Plan) -> np.ndarray:
    """The informativeness prior: a saturating function of each row's own number of terms."""
    if plan.length_weight <= 0:
        return np.zeros(len(candidates))
    lengths = np.array([content_length(kind=c.kind, text=c.text) for c in candidates], dtype=np.float64)
    return plan.length_weight * lengths / (lengths + plan.length_saturation)
