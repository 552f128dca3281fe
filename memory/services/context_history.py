"""The session's recent history as the context builder reads it: the window of newest messages and
their grouping into units kept or dropped whole (an assistant tool call with its results).

Depends only on the models, so the summariser can use it without importing the builder.
"""

from __future__ import annotations

from typing import Any

from memory.models import Message, MessageRole, Session

WINDOW_MARGIN = 64  # extra rows read past the window so a tool-call group at its edge is seen whole


def history_message(row: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": row["role"], "content": row["content"]}
    if row["tool_calls"]:
        message["tool_calls"] = row["tool_calls"]
        if not row["content"]:
            message["content"] = None
    if row["role"] == MessageRole.TOOL and row["tool_call_id"]:
        message["tool_call_id"] = row["tool_call_id"]
    name = (row["metadata"] or {}).get("name")
    if isinstance(name, str) and name:
        message["name"] = name
    return message


def tool_call_ids(tool_calls: Any) -> set[str]:
    ids = set()
    for call in tool_calls or []:
        if isinstance(call, dict) and call.get("id"):
            ids.add(str(call["id"]))
    return ids


def history_groups(rows: list[dict[str, Any]]) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Group rows (seq order) into units that are kept or dropped whole: an assistant message with
    tool_calls together with the tool results answering it; every other message alone. Returns
    (groups, orphans): tool results whose call is not among the rows (cut off by the window)."""
    groups: list[list[dict[str, Any]]] = []
    orphans: list[dict[str, Any]] = []
    open_group: list[dict[str, Any]] | None = None
    open_ids: set[str] = set()
    for row in rows:
        if row["role"] == MessageRole.TOOL:
            if open_group is not None and (row["tool_call_id"] in open_ids or not row["tool_call_id"]):
                open_group.append(row)
                continue
            orphans.append(row)
            continue
        open_group, open_ids = None, set()
        group = [row]
        groups.append(group)
        if row["role"] == MessageRole.ASSISTANT and row["tool_calls"]:
            open_group, open_ids = group, tool_call_ids(row["tool_calls"])
    return groups, orphans


def window_rows(*, session: Session, after_seq: int, window: int) -> list[dict[str, Any]]:
    """The newest `window` (+ margin) messages after `after_seq`, oldest first.

    Seqs are gapless, so the window is a seq range: bounding it explicitly keeps the query on the
    (session, seq) index whatever the planner's statistics say (a bare `ORDER BY seq DESC LIMIT`
    was planned as a scan + sort of the whole session on a freshly loaded table). Its cost
    follows the window, not the history."""
    lowest = max(after_seq, session.message_seq - window - WINDOW_MARGIN)
    rows = list(
        Message.objects.filter(session=session, seq__gt=lowest)
        .order_by("-seq")
        .values("seq", "role", "content", "tool_calls", "tool_call_id", "metadata")[: window + WINDOW_MARGIN]
    )
    rows.reverse()
    return rows  # type: ignore[return-value]
