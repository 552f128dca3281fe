"""Which ranking components earn their place: nested leave-one-conversation-out, paired bootstrap.

    nice python bench/bench_recall_components.py [--sets locomo,ua,haystack] [--pool product|scope]
        [--base recipe|default] [--seed 0] [--json out.json]

For each dev set on its own (LoCoMo-format files under tests/data/dev/, or --file), every
question is answered offline the way memory search answers it (memory_search/candidates.py's
pool, `ranking.rank`, the real MiniLM int8 embedder; vectors cached on disk in
/tmp/ctxapp_rank_cache). Then, for each component (a set of plan settings to choose among):

- nested leave-one-conversation-out: each conversation is ranked with the setting that scored
  best ((R@5 + R@10) / 2) on the OTHER conversations, so no held-out figure saw its own data;
- the held-out gain over the base plan, per question, with a paired bootstrap 95 % CI
  (10,000 resamples of the questions).

A component is kept when its CI is above zero on each set (docs/memory.md, "The ranker").
`--pool scope` ranks every turn of the conversation instead of the pool (the recipe as first
measured, offline), to show what the pool costs. `--base default` measures each component's
removal from the product's default plan instead (the gain of having it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEV = ROOT / "tests" / "data" / "dev"
CACHE = Path(os.environ.get("CTXAPP_RANK_CACHE", "/tmp/ctxapp_rank_cache"))
# Each dev set: its files, read as one set of conversations (LoCoMo-style: every
# conversations_dev*.locomo.json, so conversations added later count; haystack: the
# user-assistant set among the other conversations' sessions, in the first person).
SETS = {
    "locomo": "conversations_dev*.locomo.json",
    "ua": "user_assistant_dev.json",
    "haystack": "user_assistant_haystack_dev.json",
}

from ctxapp.cli.evaluation_data import dia_key, evidence_ids, load, turn_text  # noqa: E402
from memory.services import ranking  # noqa: E402
from memory.services.ranking import Candidate, Plan  # noqa: E402

KS = (5, 10)


class Vectors:
    """MiniLM int8 vectors of texts, cached on disk by sha256 of the text."""

    def __init__(self) -> None:
        self.path = CACHE / "minilm-int8-texts.npz"
        self.cache: dict[str, np.ndarray] = {}
        if self.path.exists():
            data = np.load(self.path)
            self.cache = {k: data[k] for k in data.files}
        self._model: Any = None
        self.embedded = 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).hexdigest()[:32] for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self.cache))
        if missing:
            if self._model is None:
                from memory.services.embedding import MiniLMEmbedder  # lazy: django-setup

                self._model = MiniLMEmbedder(threads=1, parallel=1)
            todo = {k: t for k, t in zip(keys, texts, strict=True) if k in set(missing)}
            for k, v in zip(todo, self._model.embed(list(todo.values())), strict=True):
                self.cache[k] = np.asarray(v, dtype=np.float32)
            self.embedded += len(todo)
            CACHE.mkdir(parents=True, exist_ok=True)
            np.savez(self.path, **self.cache)  # type: ignore[arg-type]
        return np.vstack([self.cache[k] for k in keys]) if keys else np.zeros((0, 384), np.float32)


@dataclass
class Turn:
    key: str
    session: str
    position: int
    speaker: str
    text: str  # index_text
    occurred_at: datetime | None


@dataclass
class Conv:
    turns: list[Turn]
    vectors: np.ndarray
    contextual: np.ndarray  # mean of the turn's vector and "previous turn + turn"'s, normalised
    by_position: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class Question:
    conv: int
    text: str
    evidence: set[str]
    category: str
    vector: np.ndarray


def load_set(paths: list[Path], vectors: Vectors) -> tuple[list[Conv], list[Question]]:
    convs: list[Conv] = []
    questions: list[Question] = []
    conversations = [c for path in paths for c in load(str(path))]
    for number, conversation in enumerate(conversations):
        turns: list[Turn] = []
        for session_number, when, raw in conversation.sessions:
            for position, turn in enumerate(raw, start=1):
                speaker = str(turn.get("speaker") or "")
                text = ranking.index_text(content=turn_text(turn), speaker=speaker or None, occurred_at=when)
                turns.append(
                    Turn(dia_key(turn.get("dia_id")), f"s{session_number}", position, speaker, text, when)
                )
        own = vectors([t.text for t in turns])
        context_texts = [
            (
                f"{ranking.window_text([turns[i - 1].text])}\n"
                if i and turns[i - 1].session == t.session
                else ""
            )
            + t.text
            for i, t in enumerate(turns)
        ]
        mixed = own + vectors(context_texts)
        mixed /= np.maximum(np.linalg.norm(mixed, axis=1, keepdims=True), 1e-12)
        conv = Conv(turns, own, mixed)
        conv.by_position = {(t.session, t.position): i for i, t in enumerate(turns)}
        convs.append(conv)
        asked = [q for q in conversation.questions if evidence_ids(q)]
        qvecs = vectors([str(q["question"]) for q in asked])
        for q, v in zip(asked, qvecs, strict=True):
            category = str(q.get("kind") or q.get("category") or "")
            questions.append(Question(number, str(q["question"]), evidence_ids(q), category, v))
    return convs, questions


# --- the pool and the ranking, as memory search does them ------------------------------------------


def own_terms(text: str) -> set[str]:
    """A turn's stemmed terms as its tsvector holds them (speaker and content, no date)."""
    return set(ranking.tokenize(ranking.window_text([text])))


def pool_indices(conv: Conv, q: Question, mode: str, contextual: bool) -> list[int]:
    """memory_search/candidates.py's pool: the best POOL_DENSE by cosine, the best POOL_LEXICAL
    rows sharing a term with the query (by BM25 over those rows), the turns within
    ±POOL_NEIGHBOURS of the best POOL_NEIGHBOUR_SEEDS of each list; `scope`: every turn."""
    if mode == "scope":
        return list(range(len(conv.turns)))
    cos = (conv.contextual if contextual else conv.vectors) @ q.vector
    dense = [int(i) for i in np.argsort(-cos, kind="stable")[: ranking.POOL_DENSE]]
    terms = set(ranking.tokenize(q.text))
    matching = [i for i, t in enumerate(conv.turns) if terms & own_terms(t.text)]
    scores = ranking.bm25_pool(
        query=q.text, documents=[ranking.window_text([conv.turns[i].text]) for i in matching]
    )
    lexical = [matching[j] for j in np.argsort(-scores, kind="stable")[: ranking.POOL_LEXICAL]]
    chosen = dict.fromkeys(dense + lexical)
    for seed in dense[: ranking.POOL_NEIGHBOUR_SEEDS] + lexical[: ranking.POOL_NEIGHBOUR_SEEDS]:
        t = conv.turns[seed]
        for offset in range(-ranking.POOL_NEIGHBOURS, ranking.POOL_NEIGHBOURS + 1):
            j = conv.by_position.get((t.session, t.position + offset))
            if j is not None:
                chosen.setdefault(j)
    return list(chosen)


def candidates_of(
    conv: Conv, q: Question, indices: list[int], plan: Plan, contextual: bool
) -> list[Candidate]:
    cos = (conv.contextual if contextual else conv.vectors)[indices] @ q.vector
    out = []
    for i, c in zip(indices, cos.tolist(), strict=True):
        t = conv.turns[i]
        window = ""
        if plan.window_radius:
            near = [
                conv.turns[j].text
                for offset in range(-plan.window_radius, plan.window_radius + 1)
                if offset and (j := conv.by_position.get((t.session, t.position + offset))) is not None
            ]
            window = ranking.window_text(near)
        out.append(
            Candidate(t.key, "message", t.text, t.session, t.position, t.occurred_at, c, t.speaker, window)
        )
    return out


@dataclass(frozen=True)
class Setting:
    plan: Plan
    contextual: bool = False


class Runner:
    """Per-question R@5 / R@10 under a setting, each ranked once."""

    def __init__(self, convs: list[Conv], questions: list[Question], pool: str) -> None:
        self.convs, self.questions, self.pool = convs, questions, pool
        self._pools: dict[tuple[int, bool], list[int]] = {}
        self._recall: dict[Setting, np.ndarray] = {}

    def recall(self, setting: Setting) -> np.ndarray:
        """(questions, 2): R@5 and R@10 of each question, in %."""
        found = self._recall.get(setting)
        if found is None:
            rows = []
            for n, q in enumerate(self.questions):
                conv = self.convs[q.conv]
                indices = self._pools.get((n, setting.contextual))
                if indices is None:
                    indices = self._pools[(n, setting.contextual)] = pool_indices(
                        conv, q, self.pool, setting.contextual
                    )
                ranked = ranking.rank(
                    query=q.text,
                    candidates=candidates_of(conv, q, indices, setting.plan, setting.contextual),
                    plan=setting.plan,
                )  # fmt: skip
                keys = [r.candidate.key for r in ranked]
                rows.append([100 * len(q.evidence & set(keys[:k])) / len(q.evidence) for k in KS])
            found = self._recall[setting] = np.array(rows)
        return found

    def held_out(self, settings: list[Setting]) -> tuple[np.ndarray, list[int]]:
        """Nested LOO: each conversation's questions under the setting best on the others."""
        convs = np.array([q.conv for q in self.questions])
        out = np.zeros((len(self.questions), 2))
        picked = []
        for c in sorted(set(convs.tolist())):
            train = convs != c
            best = max(range(len(settings)), key=lambda s: (self.recall(settings[s])[train].mean(), -s))
            out[~train] = self.recall(settings[best])[~train]
            picked.append(best)
        return out, picked


def bootstrap(diff: np.ndarray, *, seed: int, draws: int = 10_000) -> tuple[float, float, float]:
    """Mean of the paired differences and its 95 % percentile bootstrap CI."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(draws, len(diff)))].mean(axis=1)
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# Each component: the settings nested LOO chooses among, as changes of the base plan.
def components(base: Plan) -> dict[str, list[Setting]]:
    def plans(**grid: list[Any]) -> list[Setting]:
        ((name, values),) = grid.items()
        return [Setting(replace(base, **{name: v})) for v in values]

    return {
        "window BM25 (radius 1-3)": plans(window_radius=[1, 2, 3]),
        "Snowball stemming": plans(stem=[True]) if not base.stem else [],
        "speaker match (+0.25/0.5/1 z)": plans(speaker_weight=[0.25, 0.5, 1.0]),
        "date match (+0.25/0.5/1)": plans(date_weight=[0.25, 0.5, 1.0]),
        "length prior (0.25/0.5/1)": plans(length_weight=[0.25, 0.5, 1.0]),
        "current-state cue (0.2/0.5/1)": plans(current_cue_weight=[0.2, 0.5, 1.0]),
        "fusion weights (dense 0.5-0.8)": [
            Setting(replace(base, dense_weight=d, lexical_weight=round(1 - d, 2))) for d in (0.5, 0.7, 0.8)
        ],
        "neighbour smoothing tuned (0.5-1, ±1-3)": [
            Setting(replace(base, neighbour_weight=w, neighbour_radius=r))
            for w in (0.5, 0.75, 1.0)
            for r in (1, 2, 3)
            if (w, r) != (base.neighbour_weight, base.neighbour_radius)
        ],
        "contextual vector": [Setting(base, contextual=True)],
        "min-max fusion (dense 0.6/0.7, neighbour 0.5/0.75)": [
            Setting(
                replace(
                    base, fusion="minmax", dense_weight=d, lexical_weight=round(1 - d, 2), neighbour_weight=w
                )
            )
            for d in (0.6, 0.7)
            for w in (0.5, 0.75)
        ],
    }


def removals(base: Plan) -> dict[str, Setting]:
    """The default plan without each of its components (`--base default`)."""
    out = {}
    if base.window_radius:
        out["window BM25"] = Setting(replace(base, window_radius=0))
    if base.stem:
        out["Snowball stemming"] = Setting(replace(base, stem=False))
    for name in ("speaker_weight", "date_weight", "length_weight", "current_cue_weight"):
        if getattr(base, name):
            out[name] = Setting(ranking.Plan.from_dict({**_plan_fields(base), name: 0.0}))
    return out


def _plan_fields(plan: Plan) -> dict[str, Any]:
    return {f: getattr(plan, f) for f in plan.__dataclass_fields__}


def report(name: str, runner: Runner, base: Setting, settings: list[Setting], seed: int) -> dict[str, Any]:
    held, picked = runner.held_out(settings)
    reference = runner.recall(base)
    row: dict[str, Any] = {"component": name, "picked": [str(_diff(base.plan, settings[p])) for p in picked]}
    for column, k in enumerate(KS):
        mean, low, high = bootstrap(held[:, column] - reference[:, column], seed=seed + column)
        row[f"R@{k}"] = round(float(held[:, column].mean()), 1)
        row[f"gain@{k}"] = [round(mean, 1), round(low, 1), round(high, 1)]
    both = held.mean(axis=1) - reference.mean(axis=1)
    mean, low, high = bootstrap(both, seed=seed + 7)
    row["gain"] = [round(mean, 1), round(low, 1), round(high, 1)]
    return row


def _diff(base: Plan, setting: Setting) -> dict[str, Any]:
    changed = {
        f: getattr(setting.plan, f)
        for f in base.__dataclass_fields__
        if getattr(setting.plan, f) != getattr(base, f)
    }
    if setting.contextual:
        changed["contextual"] = True
    return changed


def show(row: dict[str, Any]) -> None:
    g5, g10 = row["gain@5"], row["gain@10"]
    print(
        f"  {row['component']:42} held out R@5 {row['R@5']:5.1f} ({g5[0]:+.1f} [{g5[1]:+.1f}, {g5[2]:+.1f}])"
        f"  R@10 {row['R@10']:5.1f} ({g10[0]:+.1f} [{g10[1]:+.1f}, {g10[2]:+.1f}])"
        f"  picked {sorted(set(row['picked']))}",
        flush=True,
    )


def run_set(name: str, paths: list[Path], vectors: Vectors, args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    convs, questions = load_set(paths, vectors)
    runner = Runner(convs, questions, args.pool)
    base_plan = ranking.RECIPE_PLAN if args.base == "recipe" else ranking.DEFAULT_PLAN
    base_plan = replace(base_plan, **json.loads(args.base_plan))
    base = Setting(base_plan)
    r = runner.recall(base)
    print(
        f"\n== {name}: {', '.join(p.name for p in paths)}, {len(convs)} conversations, "
        f"{len(questions)} questions "
        f"(pool: {args.pool}; loaded in {time.perf_counter() - started:.0f} s) ==\n"
        f"  base ({args.base}) R@5 {r[:, 0].mean():5.1f}  R@10 {r[:, 1].mean():5.1f}",
        flush=True,
    )
    rows = []
    if args.base == "recipe":
        for component, settings in components(base_plan).items():
            if not settings:
                continue
            rows.append(report(component, runner, base, settings, args.seed))
            show(rows[-1])
    else:
        for component, without in removals(base_plan).items():
            # The gain of having it: the default against the default without it (no parameter to choose).
            row = report(f"without {component}", runner, without, [base], args.seed)
            rows.append(row)
            show(row)
    by_category: dict[str, list[np.ndarray]] = defaultdict(list)
    for q, values in zip(questions, r, strict=True):
        by_category[q.category].append(values)
    cats = {
        c: [round(float(np.mean([v[i] for v in vs])), 1) for i in range(2)]
        for c, vs in sorted(by_category.items())
    }
    print("  by category (R@5, R@10): " + ", ".join(f"{c} {v[0]}/{v[1]}" for c, v in cats.items()))
    base_figures = [round(float(r[:, i].mean()), 1) for i in range(2)]
    return {"set": name, "questions": len(questions), "base": base_figures,
            "by_category": cats, "components": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", default="locomo,ua,haystack")
    parser.add_argument("--file", action="append", default=[], help="another LoCoMo-format file")
    parser.add_argument("--pool", default="product", choices=["product", "scope"])
    parser.add_argument("--base", default="recipe", choices=["recipe", "default"])
    parser.add_argument("--base-plan", default="{}", help="JSON changes of the recipe to test components on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    import django  # lazy: django-setup

    django.setup()  # the embedder module imports models; no database is opened
    vectors = Vectors()
    targets = [(n, sorted(DEV.glob(SETS[n]))) for n in args.sets.split(",") if n]
    targets += [(Path(f).stem, [Path(f)]) for f in args.file]
    results = [run_set(name, path, vectors, args) for name, path in targets]
    if vectors.embedded:
        print(f"\n(embedded {vectors.embedded} new texts; cached in {vectors.path})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
