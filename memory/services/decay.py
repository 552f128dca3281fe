"""Decay detection: tracked facts, references, decay reports, restatement.

CONTRACT (called by other capabilities; keep these signatures):
- facts_observe_messages: by sessions.messages_append, inside the append transaction.
- facts_for_context / facts_after_build: by the context engine around every build.
- facts_after_summary: by the summariser after it folded messages into a summary.
- facts_on_session_end: by sessions.session_end, inside its transaction.
Placeholder bodies until the decay capability lands.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PinnedFact:
    fact_id: str  # public id
    key: str
    content: str
    importance: str  # "high" | "medium" | "low"
    restated: bool  # True when it decayed and is being restated


def facts_observe_messages(*, tenant: Any, session: Any, messages: list[Any]) -> None:
    """Mark tracked facts referenced by the new messages (key terms / embedding similarity)."""
    return None


def facts_for_context(*, tenant: Any, session: Any) -> list[PinnedFact]:
    """The facts to pin at the start of the next built context, most important first."""
    return []


def facts_after_build(
    *, tenant: Any, session: Any, included_fact_ids: list[str], dropped_fact_ids: list[str], prompt_text: str
) -> list[str]:
    """Record which facts a built context carried (references, injections); return warnings."""
    return []


def facts_after_summary(*, tenant: Any, session: Any, summary_text: str, folded_seqs: list[int]) -> list[str]:
    """Check that no high-importance fact was lost from a new summary; return alerts."""
    return []


def facts_on_session_end(*, tenant: Any, session: Any) -> None:
    """Promote high-importance facts, preferences and project configuration to long-term memory."""
    return None
