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
limit 10). It reports turn recall R@1/5/10 — the fraction of a question's evidence turns among
the top k, averaged over the questions that have evidence — overall and by category, the
ingest time, query p50/p95 (client-side, HTTP included), and plain BM25 over the same turns
(over `speaker: text`, computed locally with ranking.tokenize) for comparison. With --json the
last stdout line is one JSON object; --cleanup deletes the sessions it created (and with them
their messages).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from tqdm import tqdm

from ctxapp.client import Client, CtxappError
from memory.services import ranking

KS = (1, 5, 10)
SEARCH_LIMIT = 10
INDEX_TIMEOUT_SECONDS = 1800.0
_SESSION_KEY = re.compile(r"^session_(\d+)$")
_DIA_ID = re.compile(r"D(\d+):(\d+)", re.IGNORECASE)


class HarnessError(Exception):
    """The input file or the server is not usable (a message for the command line)."""


@dataclass
class Conversation:
    sample_id: str
    sessions: list[tuple[int, datetime | None, list[dict[str, Any]]]]  # (n, date, turns)
    questions: list[dict[str, Any]]


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

    def as_dict(self) -> dict[str, Any]:
        return {
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
        }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def parse_date(text: str | None) -> datetime | None:
    """LoCoMo's '1:56 pm on 8 May, 2023' (any case) → an aware UTC datetime; None if unparsable."""
    if not text:
        return None
    cleaned = " ".join(text.strip().split())
    for pattern in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %B %Y", "%d %B, %Y", "%d %B %Y", "%Y-%m-%d"):
        try:
            return datetime.strptime(cleaned.title().replace(" On ", " on "), pattern).replace(tzinfo=UTC)
        except ValueError:
            continue
    try:
        parsed = datetime.fromisoformat(cleaned)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def dia_key(dia_id: Any) -> str:
    """A turn's id as the evidence names it: 'D3:05' and 'd3:5' are 'D3:5'; other ids unchanged."""
    text = str(dia_id or "").strip()
    match = _DIA_ID.fullmatch(text)
    return f"D{int(match[1])}:{int(match[2])}" if match else text


def evidence_ids(question: dict[str, Any]) -> set[str]:
    """The turns a question's evidence names, however LoCoMo wrote them (a list, or 'D1:2; D3:4')."""
    found: set[str] = set()
    for item in question.get("evidence") or []:
        named = [dia_key(match[0]) for match in _DIA_ID.finditer(str(item))]
        if named:
            found.update(named)
        elif item:
            found.add(str(item))
    return found


def turn_text(turn: dict[str, Any]) -> str:
    """The turn's words, with the caption of an image it shares (LoCoMo's `blip_caption`)."""
    text = str(turn.get("text") or "")
    caption = str(turn.get("blip_caption") or "").strip()
    return f"{text} [shares a photo: {caption}]".strip() if caption else text


def load(path: str) -> list[Conversation]:
    """Read a LoCoMo-format file. Raises HarnessError naming what is wrong."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise HarnessError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, list):
        raise HarnessError(f"{path}: expected a JSON list of samples")
    conversations = []
    for index, sample in enumerate(data):
        if not isinstance(sample, dict) or not isinstance(sample.get("conversation"), dict):
            raise HarnessError(f"{path}: sample {index} has no 'conversation' object")
        conv = sample["conversation"]
        sessions = []
        for key, turns in conv.items():
            match = _SESSION_KEY.match(key)
            if not match or not isinstance(turns, list):
                continue
            number = int(match.group(1))
            sessions.append((number, parse_date(conv.get(f"session_{number}_date_time")), turns))
        sessions.sort(key=lambda item: item[0])
        questions = [q for q in sample.get("qa") or [] if isinstance(q, dict) and q.get("question")]
        conversations.append(
            Conversation(
                sample_id=str(sample.get("sample_id", index)), sessions=sessions, questions=questions
            )
        )
    return conversations


def _bm25_ranking(query: str, texts: list[str]) -> list[int]:
    tokens = [ranking.tokenize(t) for t in texts]
    df: dict[str, int] = defaultdict(int)
    for doc in tokens:
        for term in set(doc):
            df[term] += 1
    stats = ranking.CorpusStats(
        n_docs=len(texts), avg_len=sum(len(d) for d in tokens) / max(1, len(tokens)), df=dict(df)
    )
    scores = ranking.bm25_scores(query=query, texts=texts, stats=stats, k1=1.2, b=0.75)
    return sorted(range(len(texts)), key=lambda i: (-scores[i], i))


def _recall_at(found: list[str], evidence: set[str], k: int) -> float:
    return len(evidence & set(found[:k])) / len(evidence)


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


@dataclass
class _Tally:
    per_question: list[tuple[str, dict[int, float]]] = field(default_factory=list)
    bm25_hits: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in (5, 10)})


def run_recall(
    path: str,
    *,
    url: str,
    api_key: str,
    cleanup: bool = False,
    progress: bool = True,
    index_timeout: float = INDEX_TIMEOUT_SECONDS,
    err: TextIO | None = None,
) -> Report:
    """Ingest, wait for indexing, ask every question; return the figures. Raises HarnessError."""
    conversations = load(path)
    run = uuid.uuid4().hex[:8]
    report = Report(conversations=len(conversations))
    err = err or sys.stderr
    created: list[str] = []
    tally = _Tally()
    with Client(url, api_key) as api:
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
                for scope in scopes:
                    _ask(api, scope, report=report, tally=tally, bar=bar)
        finally:
            if cleanup:
                _delete_sessions(api, created, err=err)
    _summarise(report, tally)
    return report


def _ingest(
    api: Client, conv: Conversation, scope_id: str, *, report: Report, created: list[str], bar: Any
) -> _Scope:
    """One ctxapp session per conversation session (date as occurred_at), appended in batches."""
    scope = _Scope(conversation=conv, scope_id=scope_id)
    for _, when, turns in conv.sessions:
        session = api.session_create(scope_id, user_id=scope_id)
        created.append(session["id"])
        messages = [_message(turn, when) for turn in turns]
        for start in range(0, len(messages), 1000):
            chunk = messages[start : start + 1000]
            out = api.messages_append(session["id"], chunk)
            for offset, turn in enumerate(turns[start : start + len(chunk)]):
                dia = dia_key(turn.get("dia_id"))
                scope.dia_of[(session["id"], out["first_seq"] + offset)] = dia
                speaker, text = str(turn.get("speaker") or ""), turn_text(turn)
                scope.turns_text.append((dia, f"{speaker}: {text}" if speaker else text))
            bar.update(len(chunk))
        report.sessions += 1
    return scope


def _message(turn: dict[str, Any], when: datetime | None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "user",
        "name": str(turn.get("speaker") or "")[:200],
        "content": turn_text(turn),
    }
    if when is not None:
        message["occurred_at"] = when.isoformat()
    return message


def _ask(api: Client, scope: _Scope, *, report: Report, tally: _Tally, bar: Any) -> None:
    """Every question of the conversation through POST /memory/search, and the BM25 baseline."""
    texts = [text for _, text in scope.turns_text]
    for question in scope.conversation.questions:
        report.questions += 1
        query = str(question["question"])
        t0 = time.perf_counter()
        found = api.memory_search(
            query,
            scope={"user_id": scope.scope_id, "agent": scope.scope_id, "sessions": "all"},
            kinds=["message"],
            limit=SEARCH_LIMIT,
        )
        report.query_ms.append((time.perf_counter() - t0) * 1000)
        bar.update(1)
        evidence = evidence_ids(question)
        if not evidence:
            continue
        report.with_evidence += 1
        ranked = [
            scope.dia_of.get((str(hit["session"]), int(hit["seq"] or 0)), "")
            for hit in found["results"]
            if hit["kind"] == "message"
        ]
        tally.per_question.append(
            (str(question.get("category", "")), {k: _recall_at(ranked, evidence, k) for k in KS})
        )
        bm25_found = [scope.turns_text[i][0] for i in _bm25_ranking(query, texts)[:10]]
        for k in (5, 10):
            tally.bm25_hits[k].append(_recall_at(bm25_found, evidence, k))


def _delete_sessions(api: Client, session_ids: list[str], *, err: TextIO) -> None:
    for session_id in session_ids:
        try:
            api.session_delete(session_id)
        except Exception as exc:  # keep deleting the rest
            print(f"ctxapp eval: could not delete {session_id}: {exc}", file=err)


def _summarise(report: Report, tally: _Tally) -> None:
    """Turn recall averaged over the questions with evidence, overall and by category."""
    per_question = tally.per_question
    if per_question:
        for k in KS:
            report.recall[k] = 100 * sum(r[k] for _, r in per_question) / len(per_question)
        for k in (5, 10):
            report.bm25[k] = 100 * sum(tally.bm25_hits[k]) / len(tally.bm25_hits[k])
    categories: dict[str, list[dict[int, float]]] = defaultdict(list)
    for category, recalls in per_question:
        categories[category].append(recalls)
    report.by_category = {
        category: {
            "questions": len(items),
            **{f"R@{k}": round(100 * sum(r[k] for r in items) / len(items), 1) for k in KS},
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
        f"ingest {data['ingest_s']:.1f} s (appends + embedding drained); "
        f"query p50 {data['query_p50_ms']:.1f} ms, p95 {data['query_p95_ms']:.1f} ms (HTTP, client side)",
        "by category:",
    ]
    for category, row in data["by_category"].items():
        lines.append(
            f"  {category:>12}  n={row['questions']:<4} R@1 {row['R@1']:5.1f}  R@5 {row['R@5']:5.1f}  "
            f"R@10 {row['R@10']:5.1f}"
        )
    return "\n".join(lines)


def main_recall(
    *, file: str, url: str, api_key: str | None, as_json: bool, cleanup: bool, out: TextIO | None = None
) -> int:
    """The `ctxapp eval recall` command. Returns the exit code."""
    out = out or sys.stdout
    if not api_key:
        print("ctxapp eval: pass --api-key (or set CTXAPP_API_KEY)", file=sys.stderr)
        return 2
    try:
        report = run_recall(file, url=url, api_key=api_key, cleanup=cleanup)
    except (HarnessError, CtxappError) as exc:
        print(f"ctxapp eval: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(report.as_dict(), sort_keys=False), file=out, flush=True)
    else:
        print(format_report(report), file=out, flush=True)
    return 0
