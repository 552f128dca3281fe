"""Smart compression of a session's history: keep what matters, not what is newest.

Each message gets a category (decision / error / code / conversation, from its event_kind or
detected from its content) and a priority: the category's base (100 / 90 / 70 / 50, policy
values) plus +20 when it is among the newest messages, +30 when it is marked important
(`metadata.important` true) and +10 for a successful outcome (`metadata.outcome == "success"`,
`metadata.success` true, or an event_kind ending in `success`/`succeeded`). Decisions are kept
whole, always. The rest are kept by priority (newer first on ties) while they fit the budget
`target_ratio * tokens before`; the best message that does not fit whole may be cut to fill what
is left. Counts are exact o200k tokens (memory.services.tokens).

Read-only on the history: messages are never deleted or changed. It records one
`session.compressed` event with the figures, so operators see it happened.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from memory.exceptions import InvalidInput
from memory.models import DecayPolicy, Message, Session, Tenant
from memory.services import recorder, tokens

DECISION, ERROR, CODE, CONVERSATION = "decision", "error", "code", "conversation"
CATEGORIES = (DECISION, ERROR, CODE, CONVERSATION)

EVENT_KIND_CATEGORIES: dict[str, str] = {
    "decision": DECISION,
    "error": ERROR,
    "tool_error": ERROR,
    "exception": ERROR,
    "failure": ERROR,
    "code": CODE,
    "code_change": CODE,
    "diff": CODE,
    "patch": CODE,
}
_ERROR_TEXT = re.compile(
    r"(Traceback \(most recent call last\)|\b[A-Z]\w*(Error|Exception)\b"
    r"|^error[:\s]|\bfailed\b|\bstack trace\b)",
    re.IGNORECASE | re.MULTILINE,
)
_CODE_TEXT = re.compile(
    r"(```|^\s*(def|class|import|from \S+ import|function|const|let|SELECT|CREATE)\b|[{};]\s*$)", re.MULTILINE
)
SUCCESS_KINDS_SUFFIXES = ("success", "succeeded")
MIN_CUT_TOKENS = 16  # a cut message shorter than this carries nothing useful
CUT_MARKER = " […]"


@dataclass
class ScoredMessage:
    seq: int
    role: str
    content: str
    category: str
    priority: int
    tokens: int
    event_kind: str = ""
    kept_tokens: int = 0
    truncated: bool = False


@dataclass
class CompressionResult:
    session: Session
    target_ratio: float
    tokens_before: int
    tokens_after: int
    kept: list[ScoredMessage] = field(default_factory=list)  # seq order
    dropped: list[ScoredMessage] = field(default_factory=list)  # seq order
    target_met: bool = True

    @property
    def ratio(self) -> float:
        return self.tokens_after / self.tokens_before if self.tokens_before else 1.0


def message_category(message: Message) -> str:
    """decision / error / code / conversation: the event_kind's category, else detected from the content."""
    kind = (message.event_kind or "").lower()
    if kind in EVENT_KIND_CATEGORIES:
        return EVENT_KIND_CATEGORIES[kind]
    content = message.content or ""
    if message.role == "tool" and isinstance(message.metadata, dict) and message.metadata.get("is_error"):
        return ERROR
    if _ERROR_TEXT.search(content):
        return ERROR
    if message.tool_calls or _CODE_TEXT.search(content):
        return CODE
    return CONVERSATION


def _is_important(metadata: Any) -> bool:
    return isinstance(metadata, dict) and metadata.get("important") is True


def _is_success(message: Message) -> bool:
    metadata = message.metadata if isinstance(message.metadata, dict) else {}
    if metadata.get("outcome") == "success" or metadata.get("success") is True:
        return True
    return (message.event_kind or "").lower().endswith(SUCCESS_KINDS_SUFFIXES)


def _text(message: Message) -> str:
    text = message.content or ""
    if message.tool_calls:
        text += json.dumps(message.tool_calls, separators=(",", ":"), ensure_ascii=False)
    return text


def messages_score(*, policy: DecayPolicy, messages: list[Message], recent: int) -> list[ScoredMessage]:
    """Category and priority of each message (see the module docstring). Pure."""
    base = {
        DECISION: policy.priority_decision,
        ERROR: policy.priority_error,
        CODE: policy.priority_code,
        CONVERSATION: policy.priority_conversation,
    }
    recent_from = len(messages) - recent
    scored = []
    for index, message in enumerate(messages):
        category = message_category(message)
        priority = base[category]
        if index >= recent_from:
            priority += policy.bonus_recent
        if _is_important(message.metadata):
            priority += policy.bonus_important
        if _is_success(message):
            priority += policy.bonus_success
        scored.append(
            ScoredMessage(
                seq=message.seq,
                role=message.role,
                content=_text(message),
                category=category,
                priority=priority,
                tokens=message.token_count,
                event_kind=message.event_kind,
            )
        )
    return scored


def _cut(text: str, budget: int) -> tuple[str, int]:
    """The head of `text` within `budget` tokens (marker included), and its exact token count."""
    encoding = tokens.encoding()
    ids = encoding.encode(text, disallowed_special=())
    marker = len(encoding.encode(CUT_MARKER))
    head = encoding.decode(ids[: max(0, budget - marker)]) + CUT_MARKER
    count = tokens.count_tokens(head)
    while (
        count > budget and head != CUT_MARKER
    ):  # decoding can merge tokens differently: shrink until it fits
        ids = ids[: max(0, len(ids) - 1 - (count - budget))]
        head = encoding.decode(ids) + CUT_MARKER
        count = tokens.count_tokens(head)
    return head, count


def session_compress(
    *,
    tenant: Tenant,
    session: Session,
    target_ratio: float | None = None,
    up_to_seq: int | None = None,
    recent_messages: int | None = None,
    allow_truncation: bool = True,
) -> CompressionResult:
    """Compress the session's history to about `target_ratio` of its tokens, by priority.

    Read-only on messages; records `session.compressed`. Raises InvalidInput for a ratio outside
    (0, 1]. When the decisions alone exceed the budget they are still all kept and
    `target_met` is False.
    """
    policy = DecayPolicy.for_tenant(tenant)
    ratio = policy.compression_target_ratio if target_ratio is None else target_ratio
    if not 0 < ratio <= 1:
        raise InvalidInput(
            "target_ratio must be greater than 0 and at most 1.",
            details={"fields": {"target_ratio": ["Must be in (0, 1]."]}},
        )
    recent = policy.compression_recent_messages if recent_messages is None else recent_messages
    queryset = Message.objects.filter(tenant=tenant, session=session)
    if up_to_seq is not None:
        queryset = queryset.filter(seq__lte=up_to_seq)
    messages = list(queryset.order_by("seq"))
    scored = messages_score(policy=policy, messages=messages, recent=recent)
    before = sum(item.tokens for item in scored)
    budget = int(before * ratio)

    kept_seqs: set[int] = set()
    used = 0
    for item in scored:
        if item.category == DECISION:
            kept_seqs.add(item.seq)
            item.kept_tokens = item.tokens
            used += item.tokens
    ranked = sorted(
        (item for item in scored if item.category != DECISION), key=lambda i: (-i.priority, -i.seq)
    )
    for item in ranked:
        if used + item.tokens <= budget:
            kept_seqs.add(item.seq)
            item.kept_tokens = item.tokens
            used += item.tokens
    if allow_truncation:
        left = budget - used
        for item in ranked:
            if item.seq in kept_seqs or left < MIN_CUT_TOKENS:
                continue
            head, count = _cut(item.content, left)
            if count < MIN_CUT_TOKENS or count > left:
                continue
            item.content, item.kept_tokens, item.truncated = head, count, True
            kept_seqs.add(item.seq)
            used += count
            break  # one cut at most: a history of many stubs reads worse than fewer whole messages
    kept = [item for item in scored if item.seq in kept_seqs]
    dropped = [item for item in scored if item.seq not in kept_seqs]
    result = CompressionResult(
        session=session,
        target_ratio=ratio,
        tokens_before=before,
        tokens_after=used,
        kept=kept,
        dropped=dropped,
        target_met=used <= budget or before == 0,
    )
    with transaction.atomic():
        recorder.event_append(
            tenant=tenant,
            type="session.compressed",
            session=session,
            payload={
                "target_ratio": ratio,
                "ratio": round(result.ratio, 4),
                "tokens_before": before,
                "tokens_after": used,
                "kept": len(kept),
                "dropped": len(dropped),
                "target_met": result.target_met,
            },
        )
    return result
