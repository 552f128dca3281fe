"""Decay detection: tracked facts, references, decay reports, restatement (issue: decay)."""

from __future__ import annotations

from typing import Any


def facts_observe_messages(*, tenant: Any, session: Any, messages: list[Any]) -> None:
    """Called in the append transaction with the new messages: marks tracked facts referenced.

    Until tracked facts exist there is nothing to mark.
    """
    return None
