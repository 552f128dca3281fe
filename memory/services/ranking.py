"""Ranking of memory search candidates: BM25, normalised fusion, neighbour smoothing. Pure.

No ORM, no I/O: the caller (memory search, context recall, the offline bench) gathers the
candidates and the corpus statistics; `rank` scores and orders them. The same function runs in
`bench/bench_recall_offline.py`, where the defaults of `Plan` were chosen by cross-validation.

WHAT THE CALLER MUST SUPPLY (so results match the offline evaluation):

- Candidates, one per searchable row of the scope (a conversation, a user's sessions, ...):
    * the top `POOL_DENSE` (100) rows by cosine to the query embedding (pgvector, HNSW);
    * the top `POOL_LEXICAL` (100) rows by full text (an OR of the query's terms, GIN);
    * for message hits of either list, the turns within ±`Plan.neighbour_radius` positions in
      the same session (same `group`), taken around the best `POOL_NEIGHBOUR_SEEDS` (30) hits of
      each list. Every candidate gets its `dense` cosine if the row has a vector (None if not).
  The union is what `rank` sees; duplicates (same `key`) must be removed by the caller. (On the
  dev set, pools of 20 to 100 per list gave the same recall: smaller pools are fine for latency.)
- `Candidate.text`: for messages, `index_text(content=..., speaker=..., occurred_at=...)` — the
  same string that was embedded; for summaries, facts and experiences their stored text.
- `CorpusStats` over the searched scope (not over the pool): `n_docs` rows, `avg_len` the mean
  number of `tokenize` tokens per row, and `df[t]` the number of rows whose tokens contain `t`,
  for each `t` in `tokenize(query)`. PostgreSQL may approximate them: `df[t]` = rows whose
  tsvector matches the term (GIN, one count per query term), `avg_len` = mean tsvector length
  (`length(search_vector)`, cacheable per scope); small differences from `tokenize` only shift
  idf a little. A term missing from `df` takes its idf within the pool instead.
- `occurred_at` for dated rows (the current-state cue compares candidates with the newest one;
  `now` is only needed when `Plan.recency_weight` > 0).
- The query embedding: the plain query text, embedded as is (`embed_query(query)`).

`rank` returns every candidate, best first, with each signal's contribution (dense, lexical,
neighbour, session, recency, length; they add up to the score); the caller cuts to its limit. Use
`DEFAULT_PLAN` for conversational memory (messages, summaries, facts) and for a pool mixing it with
experiences (one pool, one plan: one score scale across kinds; docs/memory.md, "Ordering"), and
`EXPERIENCE_PLAN` for distilled experiences alone (problem/solution texts: dense-led). Figures and
what was tried: docs/experiences.md, "Ranking: what we tried". The relevance floor a caller
applies after ranking: memory/services/relevance_floor.py.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import date, datetime
from functools import lru_cache
from typing import Any

import numpy as np

POOL_DENSE = 100
POOL_LEXICAL = 100
POOL_NEIGHBOUR_SEEDS = 30

# English function words plus the question words of chat queries ("what", "when", "did", ...).
_STOPWORD_TEXT = """
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing down during each few for from further had has have
having he her here hers herself him himself his how i if in into is it its itself just me more most
my myself no nor not now of off on once only or other our ours ourselves out over own same she should
so some such than that the their theirs them themselves then there these they this those through to
too under until up very was we were what when where which while who whom why will with would you
your yours yourself yourselves s t d ll m re ve don didn doesn isn wasn weren won wouldn couldn
shouldn hasn haven hadn aren also get got really yeah oh ok okay like much many
"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())

_TOKEN = re.compile(r"[a-z0-9]+")
_CURRENT_CUE = re.compile(
    r"\b(now|nowadays|current|currently|latest|still|anymore|these days|most recent|recently)\b",
    re.IGNORECASE,
)
FUSIONS = ("zscore", "minmax", "rrf")


_VOWELS = frozenset("aeiouy")


@lru_cache(maxsize=131072)
def _stem(token: str) -> str:
    """A light English stemmer: plurals, -ing, -ed, a final e ('rescued', 'rescue' → 'rescu').

    Measured on the LoCoMo dev set: +2.7 R@5 over plural-only stripping (docs/experiences.md).
    """
    if len(token) <= 3 or token.isdigit():
        return token
    if token.endswith("ies") and len(token) > 4:
        token = token[:-3] + "y"
    elif token.endswith("sses"):
        token = token[:-2]
    elif token.endswith("s") and not token.endswith(("ss", "us", "is")):
        token = token[:-1]
    for suffix, shortest in (("ing", 3), ("ed", 4)):  # 'breed' stays, 'adopted' → 'adopt'
        stem = token[: -len(suffix)]
        if token.endswith(suffix) and len(stem) >= shortest and _VOWELS & set(stem):
            token = stem
            if len(token) >= 4 and token[-1] == token[-2] and token[-1] not in "lsz":
                token = token[:-1]  # running → run
            break
    if token.endswith("e") and len(token) >= 4:
        token = token[:-1]
    return token


def tokenize(text: str) -> list[str]:
    """Lowercase `[a-z0-9]+` tokens, stopwords removed, lightly stemmed. Used for BM25 and df."""
    return list(_tokens(text))


@lru_cache(maxsize=65536)
def _tokens(text: str) -> tuple[str, ...]:
    return tuple(_stem(t) for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS)


@lru_cache(maxsize=65536)
def _term_counts(text: str) -> Counter[str]:
    return Counter(_tokens(text))


def messages_prepare(texts: Iterable[str]) -> None:
    """Tokenise messages' `texts` ahead of `rank`, which then finds their tokens and lengths
    cached (per process): for a caller with time to spare before it can rank, e.g. while the
    query embedding is computed."""
    for text in texts:
        _term_counts(text)
        _content_length("message", text)


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
    # strftime costs ~4 µs a call: ~1 ms for the ~270 candidates of a large scope's search.
    return f"({day} {date(year, month, day).strftime('%B %Y')}) "


# What `index_text` puts before a message's content: the date, then the speaker.
INDEX_PREFIX = re.compile(r"^(?:\(\d{1,2} [A-Z][a-z]+ \d{4}\) )?(?:[^:\n]{1,80}: )?")


def content_length(*, kind: str, text: str) -> int:
    """The number of `tokenize` tokens of a row's own words: for a message, its `index_text`
    without the date and speaker prefix (the same for every turn, so no information). Counted
    from the whole text's tokens, which BM25 has cached already, minus the prefix's."""
    return _content_length(kind, text)


@lru_cache(maxsize=65536)
def _content_length(kind: str, text: str) -> int:
    count = len(_tokens(text))
    if kind == "message":
        prefix = INDEX_PREFIX.match(text)
        if prefix is not None and prefix.end():
            count -= len(_tokens(prefix.group()))
    return count


@dataclass
class Candidate:
    key: str  # unique in the pool, e.g. "message:123"
    kind: str  # "message" | "summary" | "fact" | "experience"
    text: str  # the searchable text (index_text for messages)
    group: str | None  # session public id, for neighbour smoothing (None: no neighbours)
    position: int | None  # seq inside the group
    occurred_at: datetime | None
    dense: float | None  # cosine query↔candidate; None when the row has no vector


@dataclass
class CorpusStats:
    n_docs: int
    avg_len: float
    df: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """Every knob of the ranking. Defaults: the cross-validated choice for conversational memory."""

    dense_weight: float = 0.7
    lexical_weight: float = 0.3
    fusion: str = "minmax"  # zscore | minmax | rrf (normalised per query, over the pool)
    rrf_k: float = 60.0
    k1: float = 1.2
    b: float = 0.75
    neighbour_weight: float = 0.5  # adds w * the best fused score within ±radius in the group
    neighbour_radius: int = 3
    neighbour_decay: float = 1.0  # a neighbour d positions away counts decay^(d-1)
    session_weight: float = 0.0  # adds w * the best fused score of any candidate in the group
    prf_docs: int = 0  # pseudo-relevance feedback: expand the lexical query from the best hits
    prf_terms: int = 10
    prf_weight: float = 0.3
    recency_weight: float = 0.0  # adds w * 2^(-age / half-life), age from `now`
    # When the query asks for the current state ("where does she live now?"), adds
    # w * 2^(-age / half-life) with age from the newest candidate (imported history works alike).
    current_cue_weight: float = 0.2
    recency_half_life_days: float = 90.0
    # Informativeness prior: adds w * n / (n + saturation), n = the row's own content tokens
    # (`content_length`): "lol", "On the ceiling!" are rarely what a question is about.
    length_weight: float = 1.0
    length_saturation: float = 4.0

    _RANGES = {
        "dense_weight": (0.0, 10.0),
        "lexical_weight": (0.0, 10.0),
        "rrf_k": (1.0, 1000.0),
        "k1": (0.0, 5.0),
        "b": (0.0, 1.0),
        "neighbour_weight": (0.0, 5.0),
        "neighbour_radius": (0, 20),
        "neighbour_decay": (0.0, 1.0),
        "session_weight": (0.0, 5.0),
        "prf_docs": (0, 50),
        "prf_terms": (1, 100),
        "prf_weight": (0.0, 5.0),
        "recency_weight": (0.0, 5.0),
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
# Distilled experiences (problem/solution texts): dense-led; the small lexical share keeps rows
# without a vector (pending) and exact error strings findable. 5-fold CV on retrieval_dev.jsonl.
EXPERIENCE_PLAN = Plan(
    fusion="zscore", dense_weight=0.95, lexical_weight=0.05, neighbour_weight=0.0, length_weight=0.0
)


PART_NAMES = ("dense", "lexical", "neighbour", "session", "recency", "length")


class Ranked:
    """A candidate, its score and each signal's contribution (they add up to the score). The
    contributions are gathered when first read: a search reads them for the few hits it keeps."""

    __slots__ = ("_columns", "_contributions", "_index", "candidate", "score")

    def __init__(self, *, candidate: Candidate, score: float, columns: list[list[float]], index: int) -> None:
        self.candidate = candidate
        self.score = score
        self._columns = columns  # one list per PART_NAMES, shared by the whole ranking
        self._index = index
        self._contributions: dict[str, float] | None = None

    @property
    def contributions(self) -> dict[str, float]:
        if self._contributions is None:
            values = [column[self._index] for column in self._columns]
            self._contributions = dict(zip(PART_NAMES, values, strict=True))
        return self._contributions

    def __repr__(self) -> str:
        return f"Ranked({self.candidate.key!r}, score={self.score}, contributions={self.contributions})"


def bm25_scores(
    *,
    query: str,
    texts: list[str],
    stats: CorpusStats,
    k1: float,
    b: float,
    terms: Mapping[str, float] | None = None,
) -> np.ndarray:
    """Okapi BM25 of each text for the query terms (or the weighted `terms`).

    idf comes from the scope's statistics; a term absent from `stats.df` takes its idf within
    the texts themselves (the pool), so that it stays meaningful whatever the scope's size.
    """
    weights: Mapping[str, float] = terms if terms is not None else Counter(tokenize(query))
    docs = [_term_counts(t) for t in texts]  # shared, read-only
    return bm25_from_counts(
        weights=weights,
        tf_of=lambda term: np.array([d.get(term, 0) for d in docs], dtype=np.float64),
        lengths=np.array([len(_tokens(t)) for t in texts], dtype=np.float64),  # each doc's sum of counts
        stats=stats,
        k1=k1,
        b=b,
    )


def bm25_from_counts(
    *,
    weights: Mapping[str, float],
    tf_of: Callable[[str], np.ndarray],
    lengths: np.ndarray,
    stats: CorpusStats,
    k1: float,
    b: float,
) -> np.ndarray:
    """bm25_scores' arithmetic on counts already at hand: `tf_of(term)` is the term's count in
    each document (float64), `lengths` each document's number of tokens. A cached scope's inverted
    index (memory_search/corpus.py) gives them without reading every document's tokens."""
    scores = np.zeros(len(lengths), dtype=np.float64)
    if not weights or not len(lengths):
        return scores
    n_docs = max(stats.n_docs, 1)
    avg_len = stats.avg_len if stats.avg_len > 0 else max(1.0, float(lengths.sum()) / len(lengths))
    norm = k1 * (1.0 - b + b * lengths / avg_len)
    for term, weight in weights.items():
        tf = tf_of(term)
        df = stats.df.get(term)
        if df is None:
            n, df = len(lengths), int(np.count_nonzero(tf))
        else:
            n, df = max(n_docs, df), max(df, 0)
        idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
        scores += weight * idf * tf * (k1 + 1.0) / (tf + norm)
    return scores


def expansion_terms(*, query: str, texts: list[str], count: int) -> dict[str, float]:
    """Pseudo-relevance feedback: the `count` terms most typical of `texts` (the best hits) that
    are not in the query, weighted by their share of the hits they occur in."""
    asked = set(tokenize(query))
    seen: Counter[str] = Counter()
    for text in texts:
        seen.update(set(_tokens(text)) - asked)
    ranked = sorted(seen.items(), key=lambda item: (-item[1], item[0]))
    return {term: hits / len(texts) for term, hits in ranked[:count] if hits >= 1} if texts else {}


def _normalise(values: np.ndarray, fusion: str, rrf_k: float) -> np.ndarray:
    if len(values) == 0:
        return values
    if fusion == "rrf":
        order = np.argsort(-values, kind="stable")
        ranks = np.empty(len(values))
        ranks[order] = np.arange(1, len(values) + 1)
        return 1.0 / (rrf_k + ranks)
    if fusion == "minmax":
        low, high = values.min(), values.max()
        return (values - low) / (high - low) if high > low else np.zeros_like(values)
    std = values.std()
    return (values - values.mean()) / std if std > 0 else np.zeros_like(values)


def rank(
    *,
    query: str,
    candidates: list[Candidate],
    stats: CorpusStats,
    plan: Plan,
    now: datetime | None = None,
) -> list[Ranked]:
    """Score every candidate for `query` under `plan`; best first (ties: pool order).

    score = dense_weight · norm(cosine) + lexical_weight · norm(BM25)         (the fused score)
            + neighbour_weight · max(0, best fused score of the other candidates of the same
              group within ±neighbour_radius positions)
            + recency_weight · 2^(-age_days / recency_half_life_days)     (needs `now`)
            + current_cue_weight · 2^(-days before the newest candidate / half-life)
              only when the query asks for the current state (`asks_current_state`)
            + length_weight · n / (n + length_saturation), n = `content_length` (the row's
              own words: a one-word turn is rarely what a question is after)
    norm is per query over the pool: z-score, min-max or reciprocal rank. A candidate without a
    vector takes the pool's lowest cosine. `contributions` holds each term; they add up to score.
    """
    if not candidates:
        return []
    dense_part, lexical_part = _fused_parts(query=query, candidates=candidates, stats=stats, plan=plan)
    fused = dense_part + lexical_part
    neighbour_part = _neighbour_part(candidates, fused, plan)
    session_part = _session_part(candidates, fused, plan)
    recency_part = _recency_part(query, candidates, plan, now)
    length_part = _length_part(candidates, plan)

    parts = (dense_part, lexical_part, neighbour_part, session_part, recency_part, length_part)
    columns = [_rounded(part) for part in parts]  # in PART_NAMES order
    # A part that is zero throughout (a signal the plan leaves out) adds nothing to any sum.
    summed = [column for column in columns if any(column)] or [[0.0] * len(candidates)]
    scores = [round(sum(values), 6) for values in zip(*summed, strict=True)]
    order = sorted(range(len(candidates)), key=lambda i: -scores[i])
    return [Ranked(candidate=candidates[i], score=scores[i], columns=columns, index=i) for i in order]


def _rounded(part: np.ndarray) -> list[float]:
    """The part's values rounded to 6 decimals (Python's `round`, exact); a part of zeros (no
    negative zero among them) needs no rounding."""
    if not part.any() and not np.signbit(part).any():
        return [0.0] * len(part)
    return [round(v, 6) for v in part.tolist()]


def _fused_parts(
    *, query: str, candidates: list[Candidate], stats: CorpusStats, plan: Plan
) -> tuple[np.ndarray, np.ndarray]:
    """The dense and lexical terms, each normalised over the pool (pseudo-relevance feedback folded
    into the lexical one when the plan asks for it)."""
    dense_raw = [c.dense for c in candidates]
    known = [d for d in dense_raw if d is not None]
    floor = min(known) if known else 0.0
    dense = np.array([floor if d is None else d for d in dense_raw], dtype=np.float64)
    texts = [c.text for c in candidates]
    lexical = bm25_scores(query=query, texts=texts, stats=stats, k1=plan.k1, b=plan.b)
    dense_part = np.zeros(len(dense))
    if known:
        dense_part = plan.dense_weight * _normalise(dense, plan.fusion, plan.rrf_k)
    lexical_part = plan.lexical_weight * _normalise(lexical, plan.fusion, plan.rrf_k)
    if plan.prf_docs > 0 and plan.lexical_weight > 0:
        top = np.argsort(-(dense_part + lexical_part), kind="stable")[: plan.prf_docs]
        extra = expansion_terms(query=query, texts=[texts[i] for i in top], count=plan.prf_terms)
        if extra:
            lexical = lexical + plan.prf_weight * bm25_scores(
                query=query, texts=texts, stats=stats, k1=plan.k1, b=plan.b, terms=extra
            )
            lexical_part = plan.lexical_weight * _normalise(lexical, plan.fusion, plan.rrf_k)
    return dense_part, lexical_part


def _neighbour_part(candidates: list[Candidate], fused: np.ndarray, plan: Plan) -> np.ndarray:
    """Each turn's share of the best fused score among its group's turns within the radius."""
    part = np.zeros(len(candidates))
    if plan.neighbour_weight <= 0 or plan.neighbour_radius <= 0:
        return part
    by_group: dict[str, list[tuple[int, int]]] = {}
    for i, c in enumerate(candidates):
        if c.group is not None and c.position is not None:
            by_group.setdefault(c.group, []).append((c.position, i))
    scores = fused.tolist()
    radius, decay = plan.neighbour_radius, plan.neighbour_decay
    weight = [decay ** (d - 1) for d in range(radius + 1)]  # by distance (0: the turn itself, unused)
    for members in by_group.values():
        members.sort()
        for j, (pos, i) in enumerate(members):
            # Sorted by position: the turns within the radius are next to j on either side.
            best = 0.0
            k = j - 1
            while k >= 0 and pos - members[k][0] <= radius:
                best = max(best, scores[members[k][1]] * weight[pos - members[k][0]])
                k -= 1
            k = j + 1
            while k < len(members) and members[k][0] - pos <= radius:
                best = max(best, scores[members[k][1]] * weight[members[k][0] - pos])
                k += 1
            part[i] = plan.neighbour_weight * best
    return part


def _session_part(candidates: list[Candidate], fused: np.ndarray, plan: Plan) -> np.ndarray:
    """Each turn's share of the best fused score in its group (session)."""
    part = np.zeros(len(candidates))
    if plan.session_weight <= 0:
        return part
    best_in_group: dict[str, float] = {}
    for i, c in enumerate(candidates):
        if c.group is not None:
            best_in_group[c.group] = max(best_in_group.get(c.group, 0.0), float(fused[i]))
    for i, c in enumerate(candidates):
        if c.group is not None:
            part[i] = plan.session_weight * best_in_group[c.group]
    return part


def _recency_part(query: str, candidates: list[Candidate], plan: Plan, now: datetime | None) -> np.ndarray:
    """The current-state cue (relative to the newest candidate) and plain recency (relative to now)."""
    part = np.zeros(len(candidates))
    dated = [c.occurred_at for c in candidates if c.occurred_at is not None]
    references: list[tuple[datetime, float]] = []
    if plan.current_cue_weight > 0 and dated and asks_current_state(query):
        references.append((max(dated), plan.current_cue_weight))
    if plan.recency_weight > 0 and now is not None:
        references.append((now, plan.recency_weight))
    for reference, weight in references:
        for i, c in enumerate(candidates):
            if c.occurred_at is not None:
                age_days = max(0.0, (reference - c.occurred_at).total_seconds() / 86400.0)
                part[i] += weight * 2.0 ** (-age_days / plan.recency_half_life_days)
    return part


def _length_part(candidates: list[Candidate], plan: Plan) -> np.ndarray:
    """The informativeness prior: a saturating function of each row's own number of words."""
    if plan.length_weight <= 0:
        return np.zeros(len(candidates))
    lengths = np.array([content_length(kind=c.kind, text=c.text) for c in candidates], dtype=np.float64)
    return plan.length_weight * lengths / (lengths + plan.length_saturation)
