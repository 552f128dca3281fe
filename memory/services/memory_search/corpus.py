"""A scope's messages, cached per process and tokenised once: exact BM25 statistics and the
candidate pool of ranking.py's contract, computed in memory (scopes up to SCOPE_CORPUS_MAX)."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from cachetools import LRUCache
from django.conf import settings

from memory.models import ContentGeneration, Message, Session
from memory.services import ranking
from memory.services.embedding import EMBEDDING_DIMENSIONS
from memory.services.memory_search.sql import MessageCandidate, ScopeWhere, fetch_rows, scope_key

SCOPE_CORPUS_MAX = 20_000  # scopes up to this many messages get exact BM25 statistics (cached)
SCOPE_CORPUS_CACHE = 64  # scopes kept per process
SCOPE_CORPUS_ROWS = 200_000  # ... and at most this many messages over all of them
# ... and at most CTXAPP_MEMORY_SEARCH_CACHE_MB over all of them (ScopeCorpus.nbytes): a row's
# vector alone is 1.5 kB, so the row bound by itself would allow ~300 MB of vectors plus texts.


@dataclass
class ScopeCorpus:
    """The scope's messages, tokenised once: exact BM25 statistics and lexical pool (ranking's contract)."""

    ids: list[int]
    rows: dict[int, tuple[str, int, str, str, datetime]]  # id → (session, seq, name, content, occurred_at)
    texts: list[str]  # ranking.index_text of each row
    avg_len: float
    by_position: dict[tuple[str, int], int]  # (session, seq) → index
    # Each row's embedding (float32, unit length as stored; zeros where `embedded` is False): the
    # dense pool and the candidates' cosines are exact dot products here, no SQL round trip.
    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    embedded: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # An inverted index, built once: term → (the rows holding it, ascending; its count in each).
    # A search reads the postings of its own terms instead of visiting every row's tokens, and
    # BM25 over the matching rows is array arithmetic (the same as ranking.bm25_scores).
    postings: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))  # tokens per row
    norms: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))  # each vector's norm
    nbytes: int = 0  # what the corpus holds in memory, estimated once (corpus_nbytes)

    def df(self, term: str) -> int:
        posting = self.postings.get(term)
        return 0 if posting is None else len(posting[0])


def corpus_build(
    *,
    ids: list[int],
    rows: dict[int, tuple[str, int, str, str, datetime]],
    texts: list[str],
    by_position: dict[tuple[str, int], int],
    vectors: np.ndarray,
    embedded: np.ndarray,
) -> ScopeCorpus:
    """A corpus from its rows: the texts tokenised (ranking.tokenize), the postings, each row's
    length and vector norm, and its size."""
    counts: dict[str, tuple[list[int], list[int]]] = {}
    lengths = np.zeros(len(texts), dtype=np.float64)
    for i, text in enumerate(texts):
        tokens = ranking.tokenize(text)
        lengths[i] = len(tokens)
        for term, tf in Counter(tokens).items():
            posting = counts.get(term)
            if posting is None:
                counts[term] = ([i], [tf])
            else:
                posting[0].append(i)
                posting[1].append(tf)
    corpus = ScopeCorpus(
        ids=ids, rows=rows, texts=texts, avg_len=float(lengths.sum()) / max(1, len(texts)),
        by_position=by_position, vectors=vectors, embedded=embedded,
        postings={
            term: (np.array(at, dtype=np.int32), np.array(tf, dtype=np.float64))
            for term, (at, tf) in counts.items()
        },
        lengths=lengths,
        # As _corpus_cosines had computed them on every search: float32 norms, widened.
        norms=np.linalg.norm(vectors, axis=1).astype(np.float64),
    )  # fmt: skip
    corpus.nbytes = corpus_nbytes(corpus)
    return corpus


def corpus_nbytes(corpus: ScopeCorpus) -> int:
    """The corpus's memory footprint: its arrays plus its Python objects (strings, row tuples,
    index entries, postings), measured by sys.getsizeof."""
    size = corpus.vectors.nbytes + corpus.embedded.nbytes + corpus.lengths.nbytes + corpus.norms.nbytes
    size += sys.getsizeof(corpus.ids)
    for pk, row in corpus.rows.items():
        size += sys.getsizeof(pk) + sys.getsizeof(row) + sum(sys.getsizeof(part) for part in row)
    size += sum(sys.getsizeof(text) for text in corpus.texts)
    for term, (at, tf) in corpus.postings.items():
        size += sys.getsizeof(term) + sys.getsizeof(at) + sys.getsizeof(tf) + 64  # the pair's tuple
    # Each dict entry (rows, by_position, postings) is ~100 B of table and key tuple beyond its parts.
    return size + 100 * (len(corpus.rows) + len(corpus.by_position) + len(corpus.postings))


def cache_bound_bytes() -> int:
    return int(settings.CTXAPP.memory_search_cache_mb) * 1024 * 1024


class ScopeCorpora(LRUCache[tuple[Any, ...], tuple[tuple[Any, ...], ScopeCorpus]]):
    """Scope key → (its version, its corpus), least recently used out: at most SCOPE_CORPUS_CACHE
    scopes, SCOPE_CORPUS_ROWS messages and `cache_bound_bytes()` over all of them (a corpus larger
    than the byte bound alone is not kept). Not thread-safe: hold _corpora_lock."""

    def __init__(self) -> None:
        super().__init__(maxsize=SCOPE_CORPUS_ROWS, getsizeof=lambda entry: len(entry[1].ids))

    def nbytes(self) -> int:
        return sum(entry[1].nbytes for entry in self.values())

    def __setitem__(self, key: tuple[Any, ...], value: tuple[tuple[Any, ...], ScopeCorpus]) -> None:
        bound = cache_bound_bytes()
        if value[1].nbytes > bound:
            self.pop(key, None)
            return
        super().__setitem__(key, value)
        while len(self) > SCOPE_CORPUS_CACHE or self.nbytes() > bound:
            self.popitem()


_corpora = ScopeCorpora()
_corpora_lock = threading.Lock()


_large_scopes: dict[tuple[Any, ...], float] = {}
LARGE_SCOPE_RECHECK_SECONDS = 60.0


def _scope_version(where: ScopeWhere) -> tuple[Any, ...]:
    """The scope's version: rows (count, newest id), their vectors (how many, which model) and the
    tenant's content generation. A new message, a deletion, an embedding drained or a re-embedding
    with another model changes the first ones; a redaction, an erasure or a re-embedding with the
    same model changes none of them, and bumps the generation in its own transaction
    (memory/services/forget.py), so every process sees a committed change at its next search."""
    count, max_id, embedded, model_lo, model_hi, generation = fetch_rows(
        f"SELECT count(*), coalesce(max(m.id), 0), count(m.embedding), "
        f"coalesce(min(m.embedding_model COLLATE \"C\"), ''), "
        f"coalesce(max(m.embedding_model COLLATE \"C\"), ''), "
        f"(SELECT coalesce(max(g.generation), 0) FROM {ContentGeneration._meta.db_table} g "
        f"WHERE g.tenant_id = %s) "
        f"FROM {Message._meta.db_table} m WHERE {where.where}",
        [where.tenant_id, *where.params],
    )[0]
    return (int(count), int(max_id), int(embedded), model_lo, model_hi, int(generation))


def _corpus_load(where: ScopeWhere) -> ScopeCorpus:
    """The scope's messages read, their vectors parsed and their texts tokenised."""
    rows = fetch_rows(
        f"SELECT m.id, s.public_id, m.seq, m.name, m.content, m.occurred_at, m.embedding::text "
        f"FROM {Message._meta.db_table} m JOIN {Session._meta.db_table} s ON s.id = m.session_id "
        f"WHERE {where.where} ORDER BY m.id",
        where.params,
    )
    vectors = np.zeros((len(rows), EMBEDDING_DIMENSIONS), dtype=np.float32)
    has_vector = np.zeros(len(rows), dtype=bool)
    for i, r in enumerate(rows):
        if r[6] is not None:
            vectors[i] = np.array(r[6][1:-1].split(","), dtype=np.float32)
            has_vector[i] = True
    return corpus_build(
        ids=[r[0] for r in rows],
        rows={r[0]: (r[1], int(r[2]), r[3], r[4], r[5]) for r in rows},
        texts=[ranking.index_text(content=r[4], speaker=r[3] or None, occurred_at=r[5]) for r in rows],
        by_position={(r[1], int(r[2])): i for i, r in enumerate(rows)},
        vectors=vectors,
        embedded=has_vector,
    )


def scope_corpus(where: ScopeWhere) -> ScopeCorpus | None:
    """The cached corpus of the scope, refreshed when its messages changed; None if too large."""
    key = scope_key(where)
    seen_large = _large_scopes.get(key)
    if seen_large is not None and time.monotonic() - seen_large < LARGE_SCOPE_RECHECK_SECONDS:
        return None
    version = _scope_version(where)
    if version[0] > SCOPE_CORPUS_MAX:
        _large_scopes[key] = time.monotonic()
        return None
    with _corpora_lock:
        cached = _corpora.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
    corpus = _corpus_load(where)
    with _corpora_lock:
        _corpora[key] = (version, corpus)
    return corpus


def _corpus_cosines(corpus: ScopeCorpus, vector: np.ndarray) -> np.ndarray:
    """Cosine of every corpus row to the query, as pgvector's `1 - (a <=> b)`; NaN without a vector."""
    dots = corpus.vectors.astype(np.float64) @ vector.astype(np.float64)
    norms = corpus.norms * float(np.linalg.norm(vector))
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = dots / norms
    cosines[~corpus.embedded] = np.nan
    return cosines


def _lexical_top(
    *, corpus: ScopeCorpus, query: str, terms: set[str], stats: ranking.CorpusStats, plan: ranking.Plan
) -> list[int]:
    """The best POOL_LEXICAL rows by BM25 (ties: row order), from the query terms' postings."""
    postings = [corpus.postings[t] for t in terms if t in corpus.postings]
    if not postings:
        return []
    matching = np.unique(np.concatenate([at for at, _ in postings]))  # ascending, as the rows

    def tf_of(term: str) -> np.ndarray:
        tf = np.zeros(len(matching), dtype=np.float64)
        posting = corpus.postings.get(term)
        if posting is not None:
            tf[np.searchsorted(matching, posting[0])] = posting[1]
        return tf

    scores = ranking.bm25_from_counts(
        weights=Counter(ranking.tokenize(query)), tf_of=tf_of, lengths=corpus.lengths[matching],
        stats=stats, k1=plan.k1, b=plan.b,
    )  # fmt: skip
    return [int(matching[j]) for j in np.argsort(-scores, kind="stable")[: ranking.POOL_LEXICAL]]


def exact_message_candidates(
    *,
    corpus: ScopeCorpus,
    where: ScopeWhere,
    query: str,
    vector: Callable[[], np.ndarray | None],
    plan: ranking.Plan,
) -> tuple[list[ranking.Candidate], ranking.CorpusStats]:
    """Pool and statistics exactly as ranking.py's contract (and the offline bench) define them.
    `vector` gives the query's embedding: asked for once the lexical pool, which does not need
    it, is chosen (it is being computed on a thread of its own meanwhile)."""
    terms = set(ranking.tokenize(query))
    stats = ranking.CorpusStats(
        n_docs=len(corpus.ids), avg_len=corpus.avg_len, df={t: corpus.df(t) for t in terms}
    )
    lexical_top = _lexical_top(corpus=corpus, query=query, terms=terms, stats=stats, plan=plan)
    cosines: np.ndarray | None = None
    dense_top: list[int] = []
    query_vector = vector()
    if query_vector is not None and corpus.embedded.any():
        cosines = _corpus_cosines(corpus, query_vector)
        with_vector = np.flatnonzero(corpus.embedded)
        best = np.argsort(-cosines[with_vector], kind="stable")[: ranking.POOL_DENSE]
        dense_top = [int(i) for i in with_vector[best]]
    chosen = dict.fromkeys(dense_top + lexical_top)
    radius = plan.neighbour_radius if plan.neighbour_weight > 0 else 0
    seeds = dense_top[: ranking.POOL_NEIGHBOUR_SEEDS] + lexical_top[: ranking.POOL_NEIGHBOUR_SEEDS]
    for seed in seeds if radius else []:
        session, seq, *_ = corpus.rows[corpus.ids[seed]]
        for offset in range(-radius, radius + 1):
            j = corpus.by_position.get((session, seq + offset))
            if j is not None:
                chosen.setdefault(j)
    candidates: list[ranking.Candidate] = []
    for i in chosen:
        pk = corpus.ids[i]
        session, seq, name, content, occurred_at = corpus.rows[pk]
        cos = None if cosines is None or not corpus.embedded[i] else float(cosines[i])
        candidates.append(
            MessageCandidate(
                key=f"message:{pk}", kind="message", text=corpus.texts[i], group=session, position=seq,
                occurred_at=occurred_at, dense=None if cos is None else float(cos), speaker=name,
                content=content,
            )
        )  # fmt: skip
    return candidates, stats
