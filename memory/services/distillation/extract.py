"""The extractors of distillation: what a finished task teaches, as candidate experiences.

Pure apart from reading: `extract_direct` (the task's input and output), `extract_patterns`
(user-problem → assistant-solution turns of its session), `extract_summary` (the configured
OpenAI-compatible chat endpoint, asked for JSON; never raises). memory.services.distillation
stores what they find.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from memory.models import ExtractionMethod, Message, MessageRole, Task, TaskStatus, ValueTier
from memory.services.chat_endpoint import chat_parsed
from memory.services.user_memory.rules import is_small_talk

logger = logging.getLogger(__name__)

MAX_PROBLEM_CHARS = 1000
MAX_SOLUTION_CHARS = 4000
MAX_TRANSCRIPT_CHARS = 12_000
MAX_SESSION_MESSAGES = 400

PROBLEM_RE = re.compile(
    r"\b(error|exception|traceback|fail\w*|broken|crash\w*|time[sd]? ?out|timeout|not work\w*|doesn'?t work|"
    r"won'?t|can'?t|cannot|unable|issue|problem|bug|stuck|slow|hang\w*|denied|refused|"
    r"how (do|can|to|should))\b|\?",
    re.IGNORECASE,
)
SOLUTION_RE = re.compile(
    r"\b(fix\w*|solv\w*|resolv\w*|because|caused by|root cause|try|use|set|add|remove|change|increase|"
    r"decrease|raise|lower|install|upgrade|downgrade|restart|run|enable|disable|replace|update)\b",
    re.IGNORECASE,
)
CONFIRM_RE = re.compile(
    r"\b(thanks?|thank you|that (worked|works|fixed it|did it)|works now|it works|fixed|solved|perfect)\b",
    re.I,
)
CAUSE_RE = re.compile(
    r"(?:root cause(?: is| was)?:?|the (?:issue|problem|cause) (?:is|was)|because(?: of)?|caused by|"
    r"due to)\s+"
    r"([^.\n]{5,300})",
    re.IGNORECASE,
)


@dataclass
class Candidate:
    problem: str
    solution: str
    cause: str = ""
    confidence: float = 0.5
    method: str = ExtractionMethod.DIRECT
    message_seqs: list[int] = field(default_factory=list)


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _find_cause(text: str) -> str:
    match = CAUSE_RE.search(text)
    return match.group(1).strip() if match else ""


# --- extractors (pure: they only read) ----------------------------------------------------------


def extract_direct(task: Task) -> list[Candidate]:
    """The task itself: input → problem, output → solution (or, failed, → cause)."""
    problem = task.input.strip() or task.title.strip()
    if not problem or is_small_talk(problem):  # "Thanks, anything else?" teaches nothing
        return []
    if task.status == TaskStatus.FAILED:
        cause = task.output.strip()
        return [
            Candidate(
                problem=_clip(problem, MAX_PROBLEM_CHARS),
                solution="",
                cause=_clip(f"Attempt failed: {cause}" if cause else "Attempt failed.", MAX_SOLUTION_CHARS),
                confidence=0.3,
            )
        ]
    if not task.output.strip():
        return []
    confidence = 0.8 if task.value_tier == ValueTier.HIGH else 0.7
    return [
        Candidate(
            problem=_clip(problem, MAX_PROBLEM_CHARS),
            solution=_clip(task.output, MAX_SOLUTION_CHARS),
            cause=_clip(_find_cause(task.output), MAX_PROBLEM_CHARS),
            confidence=confidence,
        )
    ]


def session_messages(task: Task) -> list[Message]:
    if task.session_id is None:
        return []
    queryset = Message.objects.filter(session_id=task.session_id)
    if task.finished_at is not None:
        queryset = queryset.filter(created_at__lte=task.finished_at)
    return list(queryset.order_by("-seq")[:MAX_SESSION_MESSAGES])[::-1]


def extract_patterns(messages: list[Message]) -> list[Candidate]:
    """User-problem → assistant-solution turns: a user message that states a problem, the
    assistant replies up to the next user message that propose a fix; confirmed when the next
    user message says it worked."""
    candidates: list[Candidate] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        content = message.content or ""
        # An acknowledgement or a closing ("Thanks. Anything else before we close?") is not a
        # problem, whatever the assistant answers to it.
        if message.role != MessageRole.USER or not PROBLEM_RE.search(content) or is_small_talk(content):
            index += 1
            continue
        replies: list[Message] = []
        cursor = index + 1
        while cursor < len(messages) and messages[cursor].role != MessageRole.USER:
            if messages[cursor].role == MessageRole.ASSISTANT and (messages[cursor].content or "").strip():
                replies.append(messages[cursor])
            cursor += 1
        solution_text = "\n".join(r.content.strip() for r in replies)
        if replies and SOLUTION_RE.search(solution_text):
            seqs = [message.seq, *(r.seq for r in replies)]
            confidence = 0.5
            if cursor < len(messages) and CONFIRM_RE.search(messages[cursor].content or ""):
                confidence = 0.7
                seqs.append(messages[cursor].seq)
            candidates.append(
                Candidate(
                    problem=_clip(message.content, MAX_PROBLEM_CHARS),
                    solution=_clip(solution_text, MAX_SOLUTION_CHARS),
                    cause=_clip(_find_cause(solution_text), MAX_PROBLEM_CHARS),
                    confidence=confidence,
                    method=ExtractionMethod.PATTERN,
                    message_seqs=seqs,
                )
            )
        index = cursor
    return candidates


SUMMARY_SYSTEM_PROMPT = (
    "You distil reusable experience from an agent's finished task. Reply with JSON only, no prose: "
    '{"experiences": [{"problem": str, "cause": str, "solution": str, "confidence": number 0..1, '
    '"message_seqs": [int]}]}. One entry per distinct problem that was actually solved; '
    "an empty list if nothing reusable was learned."
)


class MalformedModelOutput(ValueError):
    pass


def parse_summary_output(text: str) -> list[Candidate]:
    """Candidates from the model's reply. Tolerates code fences and prose around one JSON object;
    raises MalformedModelOutput for anything else."""
    cleaned = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    start, end = cleaned.find("{"), cleaned.rfind("}")
    if start < 0 or end <= start:
        raise MalformedModelOutput("no JSON object in the reply")
    try:
        data = json.loads(cleaned[start : end + 1])
    except json.JSONDecodeError as exc:
        raise MalformedModelOutput(f"invalid JSON: {exc}") from None
    items = data.get("experiences") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise MalformedModelOutput('the reply has no "experiences" list')
    candidates = []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or not str(item.get("problem", "")).strip():
            raise MalformedModelOutput(f"experience {position} has no problem")
        if is_small_talk(str(item["problem"])):
            continue
        try:
            confidence = float(item.get("confidence", 0.6))
        except (TypeError, ValueError):
            raise MalformedModelOutput(f"experience {position} has a non-numeric confidence") from None
        seqs = [int(s) for s in item.get("message_seqs") or [] if isinstance(s, int | float)]
        candidates.append(
            Candidate(
                problem=_clip(str(item["problem"]), MAX_PROBLEM_CHARS),
                cause=_clip(str(item.get("cause") or ""), MAX_PROBLEM_CHARS),
                solution=_clip(str(item.get("solution") or ""), MAX_SOLUTION_CHARS),
                confidence=min(1.0, max(0.0, confidence)),
                method=ExtractionMethod.SUMMARY,
                message_seqs=seqs,
            )
        )
    return candidates


def _transcript(task: Task, messages: list[Message]) -> str:
    lines = [
        f"TASK INPUT:\n{task.input}",
        f"TASK OUTPUT ({task.status}):\n{task.output}",
        "SESSION MESSAGES:",
    ]
    lines += [f"[seq {m.seq}] {m.role}: {m.content}" for m in messages]
    text = "\n".join(lines)
    return text[-MAX_TRANSCRIPT_CHARS:]


def extract_summary(task: Task, messages: list[Message]) -> tuple[list[Candidate], dict[str, Any]]:
    """Ask the configured chat endpoint. Returns (candidates, report). Never raises: after the
    retries the report says `fallback` and why, and the caller keeps the offline results."""
    conf = settings.CTXAPP
    url = conf.summariser_url
    if not url or not conf.distill_llm:
        return [], {"status": "not_configured"}
    attempts = 1 + max(0, conf.summariser_retries)
    chat = [
        {"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
        {"role": "user", "content": _transcript(task, messages)},
    ]
    candidates, errors = chat_parsed(chat, parse_summary_output)
    if candidates is not None:
        return candidates, {"status": "ok", "attempts": len(errors) + 1, "errors": errors}
    logger.warning("LLM-summary extraction of %s fell back to offline extractors: %s", task.public_id, errors)
    return [], {"status": "fallback", "attempts": attempts, "errors": errors}
