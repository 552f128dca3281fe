"""`ctxapp eval recall FILE`: turn recall of memory search on a LoCoMo-format file, through the API.

The file is a JSON list of samples, each with
    conversation: {speaker_a, speaker_b, session_N: [{speaker, dia_id, text}], session_N_date_time}
    qa:           [{question, answer, evidence: [dia_id, ...], category}]

The original LoCoMo release's quirks are read as its authors meant them: a turn that shares an
image carries its caption (`blip_caption`), which becomes part of the message ("[shares a photo:
…]"); evidence written as one string ("D8:6; D9:17") or with leading zeros ("D30:05") names the
same turns as the `dia_id`s it means.

For each sample (conversation) the harness creates a fresh agent and user (`eval-<run>-<n>`), one
ctxapp session per conversation session, and appends its turns in one batch each, with the
speaker as the message `name` (indexed) and `occurred_at` from `session_N_date_time`. It then
waits until the tenant has no message pending embedding (polling GET /memory/index), and asks
every question through POST /memory/search (kinds: message; scope: that user, all sessions;
limit 10; `--kinds` widens it: a user memory hit stands for the turns it was taken from). It
reports turn recall R@1/5/10 — the fraction of a question's evidence turns among the top k,
averaged over the questions that have evidence — overall and by category, the ingest time, query
p50/p95 (client-side, HTTP included), and plain BM25 over the same turns (over `speaker: text`,
computed locally with ranking.tokenize) for comparison.

It also opens a NEW session of the same user and agent per conversation and builds a context for
every question in it (POST /sessions/{id}/context, the question as input, the tenant's policy):
`evidence_in_prompt` is the fraction of a question's evidence turns the prompt carries (recalled
turns, and the source turns a recalled user memory brings), with the median recalled tokens and
items per build.

`--baseline` ranks every question with issue 35's plain recipe too, computed locally
(evaluation_baseline.py), and reports it beside ctxapp's figures with the paired bootstrap CI of
the difference.

`--loo` chooses settings by nested leave-one-conversation-out: each conversation is scored with the
ranking plan (LOO_PLANS) and the recall cut (LOO_RECALL) that did best on the OTHER
conversations, and the held-out figures are reported beside the in-sample ones (the server's
defaults). With --json the last stdout line is one JSON object; --cleanup deletes the sessions
it created (and with them their messages).

Besides the LoCoMo format the harness reads the dev sets' own format ({conversations: [{id,
speakers, sessions: [{id, date, turns: [{id, speaker, text}]}], questions: [{question,
evidence: [turn id], category}]}]}, tests/data/dev/conversations_dev.json and
user_assistant_dev.json): a turn's id is its evidence id there.
"""

from __future__ import annotations

import json
import math
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO, cast

from tqdm import tqdm

from ctxapp.cli.evaluation_baseline import BaselineTurn, RecipeBaseline, baseline_turn
from ctxapp.cli.evaluation_data import (
    Conversation,
    HarnessError,
    dia_key,
    evidence_ids,
    load,
    turn_text,
)
from ctxapp.cli.evaluation_loo import (
    KS,
    LOO_PLANS,
    LOO_RECALL,
    Asked,
    leave_one_out,
    median,
    versus_baseline,
)
from ctxapp.client import Client, CtxappError
from ctxapp.client._core import BACKOFF_MAX
from memory.services import ranking

SEARCH_LIMIT = 10
DEFAULT_KINDS = ("message",)
INDEX_TIMEOUT_SECONDS = 1800.0


# A run outpaces the server's per-key rate limit (CTXAPP_THROTTLE_KEY_RATE, 1200 a minute, in a
# fixed 60 s window: a 429 says to wait until the window ends). The client waits at most 5 s
# before each retry (BACKOFF_MAX, for agents that must not stall), so enough retries to outlast a
# whole window: a long file then runs at the rate the server allows instead of stopping.
RATE_LIMIT_RETRIES = int(60 / BACKOFF_MAX) + 3


@dataclass
class Report:
    questions: int = 0
    with_evidence: int = 0
    recall: dict[int, float] = field(default_factory=dict)
    by_category: dict[str, dict[str, Any]] = field(default_factory=dict)
    ingest_s: float = 0.0
    query_ms: list[float] = field(default_factory=list)
    bm25: dict[int, float] = field(default_factory=dict)
    turns: int = 0
    sessions: int = 0
    conversations: int = 0
    kinds: tuple[str, ...] = DEFAULT_KINDS
    evidence_in_prompt: float = 0.0
    recalled_tokens: list[int] = field(default_factory=list)
    recalled_items: list[int] = field(default_factory=list)
    loo: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "questions": self.questions,
            "questions_with_evidence": self.with_evidence,
            "conversations": self.conversations,
            "sessions": self.sessions,
            "turns": self.turns,
            **{f"R@{k}": round(self.recall.get(k, 0.0), 1) for k in KS},
            "by_category": self.by_category,
            "ingest_s": round(self.ingest_s, 2),
            "query_p50_ms": round(percentile(self.query_ms, 50), 1),
            "query_p95_ms": round(percentile(self.query_ms, 95), 1),
            "bm25": {f"R@{k}": round(self.bm25.get(k, 0.0), 1) for k in (5, 10)},
            "kinds": list(self.kinds),
            "evidence_in_prompt": round(self.evidence_in_prompt, 1),
            "recalled_tokens_median": median(self.recalled_tokens),
            "recalled_items_median": median(self.recalled_items),
        }
        if self.loo is not None:
            out["loo"] = self.loo
        if self.baseline is not None:
            out["baseline"] = self.baseline
        return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def _bm25_ranking(query: str, texts: list[str]) -> list[int]:
    """Plain Okapi BM25 over the conversation's turns (unstemmed words, as the recipe counts them)."""
    scores = ranking.bm25_pool(query=query, documents=texts, stem=False)
    return sorted(range(len(texts)), key=lambda i: (-scores[i], i))


def _baseline_figures(asked: list[Asked]) -> dict[str, Any]:
    """The plain recipe's recall, overall and by category, and ctxapp's (the server's defaults)
    minus it per question with a paired bootstrap 95 % CI."""
    if not asked:
        return {}
    categories: dict[str, list[Asked]] = defaultdict(list)
    for item in asked:
        categories[item.category].append(item)
    return {
        **{f"R@{k}": round(100 * sum(a.baseline[k] for a in asked) / len(asked), 1) for k in KS},
        "by_category": {
            category: {
                f"R@{k}": round(100 * sum(a.baseline[k] for a in items) / len(items), 1) for k in (5, 10)
            }
            for category, items in sorted(categories.items())
        },
        "ctxapp_minus_recipe": versus_baseline([(a.recall[0], a.baseline) for a in asked]),
    }


def _recall_at(found: list[set[str]], evidence: set[str], k: int) -> float:
    """The fraction of `evidence` among the turns of the first k hits (each hit: its turns)."""
    return len(evidence & set().union(*found[:k])) / len(evidence)


def _wait_for_index(api: Client, *, timeout: float, progress: Any) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        status = api.memory_index_status()
        if progress is not None:
            progress.set_postfix(pending=status.get("pending", 0))
        if status.get("pending", 0) == 0:
            return
        if time.monotonic() > deadline:
            raise HarnessError(f"indexing did not finish within {timeout:.0f} s: {status}")
        time.sleep(delay)
        delay = min(0.5, delay * 1.5)


@dataclass
class _Scope:
    """One conversation as ingested: its scope id, (session id, seq) → dia_id, and its turns'
    (dia_id, text) as the server indexes them for words (speaker + text), for the BM25 baseline."""

    conversation: Conversation
    scope_id: str
    dia_of: dict[tuple[str, int], str] = field(default_factory=dict)
    turns_text: list[tuple[str, str]] = field(default_factory=list)
    turns: list[BaselineTurn] = field(default_factory=list)  # for the plain recipe (--baseline)


def run_recall(
    path: str,
    *,
    url: str,
    api_key: str,
    cleanup: bool = False,
    progress: bool = True,
    index_timeout: float = INDEX_TIMEOUT_SECONDS,
    err: TextIO | None = None,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    loo: bool = False,
    baseline: bool = False,
) -> Report:
    """Ingest, wait for indexing, ask every question; return the figures. Raises HarnessError."""
    conversations = load(path)
    run = uuid.uuid4().hex[:8]
    report = Report(conversations=len(conversations), kinds=kinds)
    err = err or sys.stderr
    created: list[str] = []
    asked: list[Asked] = []
    plans = LOO_PLANS if loo else LOO_PLANS[:1]
    recalls = LOO_RECALL if loo else LOO_RECALL[:1]
    with Client(url, api_key, retries=RATE_LIMIT_RETRIES) as api:
        try:
            total_turns = sum(len(turns) for c in conversations for _, _, turns in c.sessions)
            started = time.perf_counter()
            with tqdm(total=total_turns, desc="ingest", unit="turn", file=err, disable=not progress) as bar:
                scopes = [
                    _ingest(api, conv, f"eval-{run}-{number}", report=report, created=created, bar=bar)
                    for number, conv in enumerate(conversations)
                ]
                report.turns = total_turns
                bar.set_description("indexing")
                _wait_for_index(api, timeout=index_timeout, progress=bar)
            report.ingest_s = time.perf_counter() - started
            total_questions = sum(len(scope.conversation.questions) for scope in scopes)
            with tqdm(
                total=total_questions, desc="questions", unit="q", file=err, disable=not progress
            ) as bar:
                for number, scope in enumerate(scopes):
                    # A new session of the same user: what a context build there puts in the prompt.
                    probe = api.session_create(scope.scope_id, user_id=scope.scope_id)["id"]
                    created.append(probe)
                    recipe = RecipeBaseline(scope.turns) if baseline else None
                    asker = _Asker(
                        api=api, scope=scope, probe=probe, kinds=kinds, plans=plans, recalls=recalls,
                        recipe=recipe,
                    )  # fmt: skip
                    asked += asker.ask_all(number, report=report, bar=bar)
        finally:
            if cleanup:
                _delete_sessions(api, created, err=err)
    _summarise(report, asked)
    if baseline:
        report.baseline = _baseline_figures(asked)
    if loo:
        report.loo = leave_one_out(asked, conversations=len(conversations))
    return report


def _ingest(
    api: Client, conv: Conversation, scope_id: str, *, report: Report, created: list[str], bar: Any
) -> _Scope:
    """One ctxapp session per conversation session (date as occurred_at), appended in batches."""
    scope = _Scope(conversation=conv, scope_id=scope_id)
    for _, when, turns in conv.sessions:
        session = api.session_create(scope_id, user_id=scope_id)
        created.append(session["id"])
        messages = [message_of(turn, when) for turn in turns]
        for start in range(0, len(messages), 1000):
            chunk = messages[start : start + 1000]
            out = api.messages_append(session["id"], chunk)
            for offset, turn in enumerate(turns[start : start + len(chunk)]):
                dia = dia_key(turn.get("dia_id"))
                scope.dia_of[(session["id"], out["first_seq"] + offset)] = dia
                speaker, text = str(turn.get("speaker") or ""), turn_text(turn)
                scope.turns_text.append((dia, f"{speaker}: {text}" if speaker else text))
                scope.turns.append(
                    baseline_turn(
                        dia=dia, session=session["id"], position=out["first_seq"] + offset,
                        speaker=speaker, text=text, when=when,
                    )
                )  # fmt: skip
            bar.update(len(chunk))
        report.sessions += 1
    return scope


def message_of(turn: dict[str, Any], when: datetime | None) -> dict[str, Any]:
    role = turn.get("role") if turn.get("role") in ("user", "assistant") else "user"
    message: dict[str, Any] = {
        "role": role,
        "name": str(turn.get("speaker") or "")[:200],
        "content": turn_text(turn),
    }
    if when is not None:
        message["occurred_at"] = when.isoformat()
    return message


@dataclass
class _Asker:
    """Asks one conversation's questions: memory search under each plan, a context build in the
    probe session under each recall cut, and the BM25 baseline."""

    api: Client
    scope: _Scope
    probe: str
    kinds: tuple[str, ...]
    plans: tuple[dict[str, Any], ...]
    recalls: tuple[dict[str, Any], ...]
    recipe: RecipeBaseline | None = None

    def ask_all(self, number: int, *, report: Report, bar: Any) -> list[Asked]:
        texts = [text for _, text in self.scope.turns_text]
        out = []
        for question in self.scope.conversation.questions:
            report.questions += 1
            query = str(question["question"])
            recall = []
            for index, plan in enumerate(self.plans):
                t0 = time.perf_counter()
                found = self.api.memory_search(
                    query,
                    scope={"user_id": self.scope.scope_id, "agent": self.scope.scope_id, "sessions": "all"},
                    kinds=list(self.kinds),
                    limit=SEARCH_LIMIT,
                    plan=plan or None,
                )
                if index == 0:
                    report.query_ms.append((time.perf_counter() - t0) * 1000)
                recall.append(cast(list[dict[str, Any]], found["results"]))
            evidence = evidence_ids(question)
            if not evidence:
                bar.update(1)
                continue
            report.with_evidence += 1
            bm25_found = [self.scope.turns_text[i][0] for i in _bm25_ranking(query, texts)[:10]]
            recipe_found = self.recipe.ranked(query)[:10] if self.recipe is not None else []
            out.append(
                Asked(
                    conversation=number,
                    category=str(question.get("category", "")),
                    recall=[
                        {k: _recall_at(self._turns_of(hits), evidence, k) for k in KS} for hits in recall
                    ],
                    prompt=[self._prompt(query, evidence, cut) for cut in self.recalls],
                    bm25={k: _recall_at([{dia} for dia in bm25_found], evidence, k) for k in (5, 10)},
                    baseline={k: _recall_at([{d} for d in recipe_found], evidence, k) for k in KS}
                    if self.recipe is not None
                    else {},
                )
            )
            bar.update(1)
        return out

    def _turns_of(self, hits: list[dict[str, Any]]) -> list[set[str]]:
        """Each hit's turns as evidence names them: a message its own, a user memory those it was
        taken from, any other kind none (it still takes its place in the top k)."""
        out: list[set[str]] = []
        for hit in hits:
            if hit["kind"] == "message":
                pairs = [(str(hit["session"]), int(hit["seq"] or 0))]
            else:
                pairs = [(str(s.get("session")), int(s.get("seq") or 0)) for s in hit.get("sources") or []]
            out.append({self.scope.dia_of[pair] for pair in pairs if pair in self.scope.dia_of})
        return out

    def _prompt(self, query: str, evidence: set[str], cut: dict[str, Any]) -> tuple[float, int, int]:
        built = self.api.context_build(self.probe, query, recall=cut or None)
        recalled = [
            item for item in built["manifest"]["items"] if item["kind"] == "recall" and item["included"]
        ]
        # A message excerpt lists every turn it quotes in `seqs`.
        turns = {
            self.scope.dia_of.get((str(item.get("session")), int(seq)), "")
            for item in recalled
            if item.get("source") == "message"
            for seq in item.get("seqs") or [item.get("seq") or 0]
        }
        tokens = sum(int(item.get("tokens") or 0) for item in recalled)
        return len(evidence & turns) / len(evidence), tokens, len(recalled)


def _delete_sessions(api: Client, session_ids: list[str], *, err: TextIO) -> None:
    for session_id in session_ids:
        try:
            api.session_delete(session_id)
        except Exception as exc:  # keep deleting the rest
            print(f"ctxapp eval: could not delete {session_id}: {exc}", file=err)


def _summarise(report: Report, asked: list[Asked]) -> None:
    """Turn recall and evidence in the prompt (the first setting of each: the server's defaults),
    averaged over the questions with evidence, overall and by category."""
    if asked:
        for k in KS:
            report.recall[k] = 100 * sum(a.recall[0][k] for a in asked) / len(asked)
        for k in (5, 10):
            report.bm25[k] = 100 * sum(a.bm25[k] for a in asked) / len(asked)
        report.evidence_in_prompt = 100 * sum(a.prompt[0][0] for a in asked) / len(asked)
        report.recalled_tokens = [a.prompt[0][1] for a in asked]
        report.recalled_items = [a.prompt[0][2] for a in asked]
    categories: dict[str, list[Asked]] = defaultdict(list)
    for item in asked:
        categories[item.category].append(item)
    report.by_category = {
        category: {
            "questions": len(items),
            **{f"R@{k}": round(100 * sum(a.recall[0][k] for a in items) / len(items), 1) for k in KS},
            "evidence_in_prompt": round(100 * sum(a.prompt[0][0] for a in items) / len(items), 1),
        }
        for category, items in sorted(categories.items())
    }


def format_report(report: Report) -> str:
    data = report.as_dict()
    lines = [
        f"conversations {data['conversations']}, sessions {data['sessions']}, turns {data['turns']}, "
        f"questions {data['questions']} ({data['questions_with_evidence']} with evidence)",
        f"memory search  R@1 {data['R@1']:5.1f}   R@5 {data['R@5']:5.1f}   R@10 {data['R@10']:5.1f}",
        f"plain BM25                R@5 {data['bm25']['R@5']:5.1f}   R@10 {data['bm25']['R@10']:5.1f}",
        f"evidence in the prompt of a new session {data['evidence_in_prompt']:5.1f} %, "
        f"median {data['recalled_tokens_median']:.0f} recalled tokens "
        f"({data['recalled_items_median']:.0f} items)",
        f"ingest {data['ingest_s']:.1f} s (appends + embedding drained); "
        f"query p50 {data['query_p50_ms']:.1f} ms, p95 {data['query_p95_ms']:.1f} ms (HTTP, client side)",
    ]
    if data.get("baseline"):
        base = data["baseline"]
        lines.append(
            f"plain recipe   R@1 {base['R@1']:5.1f}   R@5 {base['R@5']:5.1f}   R@10 {base['R@10']:5.1f}"
            f"   (ctxapp minus recipe: {_gain_text(base['ctxapp_minus_recipe'])})"
        )
    if data.get("loo"):
        loo = data["loo"]
        lines.append(
            f"leave-one-conversation-out  R@1 {loo['R@1']:5.1f}   R@5 {loo['R@5']:5.1f}   "
            f"R@10 {loo['R@10']:5.1f}"
            f"   evidence in the prompt {loo['evidence_in_prompt']:5.1f} % "
            f"(median {loo['recalled_tokens_median']:.0f} tokens)"
        )
        if loo.get("versus_baseline"):
            lines.append(f"  held out, minus the plain recipe: {_gain_text(loo['versus_baseline'])}")
    lines.append("by category:")
    for category, row in data["by_category"].items():
        lines.append(
            f"  {category:>12}  n={row['questions']:<4} R@1 {row['R@1']:5.1f}  R@5 {row['R@5']:5.1f}  "
            f"R@10 {row['R@10']:5.1f}  in prompt {row['evidence_in_prompt']:5.1f}"
        )
    return "\n".join(lines)


def _gain_text(gains: dict[str, list[float]]) -> str:
    return ", ".join(f"{k} {v[0]:+.1f} [{v[1]:+.1f}, {v[2]:+.1f}]" for k, v in gains.items())


def parse_kinds(text: str | None) -> tuple[str, ...]:
    """`--kinds message,user_memory` → the kinds (default: messages only)."""
    kinds = tuple(dict.fromkeys(k.strip() for k in (text or "").split(",") if k.strip()))
    return kinds or DEFAULT_KINDS


def main_recall(
    *,
    file: str,
    url: str,
    api_key: str | None,
    as_json: bool,
    cleanup: bool,
    out: TextIO | None = None,
    kinds: str | None = None,
    loo: bool = False,
    baseline: bool = False,
) -> int:
    """The `ctxapp eval recall` command. Returns the exit code."""
    out = out or sys.stdout
    if not api_key:
        print("ctxapp eval: pass --api-key (or set CTXAPP_API_KEY)", file=sys.stderr)
        return 2
    try:
        report = run_recall(
            file, url=url, api_key=api_key, cleanup=cleanup, kinds=parse_kinds(kinds), loo=loo,
            baseline=baseline,
        )  # fmt: skip
    except (HarnessError, CtxappError) as exc:
        print(f"ctxapp eval: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(report.as_dict(), sort_keys=False), file=out, flush=True)
    else:
        print(format_report(report), file=out, flush=True)
    return 0
