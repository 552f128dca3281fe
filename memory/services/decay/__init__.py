"""Decay detection: tracked facts, references, decay reports, restatement, session-end promotion.

Vocabulary. A *round* is a user turn: round N starts with the session's N-th user message, and
every message up to the next user message belongs to it. A fact is *referenced* when a message
mentions it (key-term overlap, else embedding similarity), when the agent says so explicitly,
or when a built context restates it. A fact *decays* once the session is `threshold` rounds past
its last reference (policy: 20, or 10 for high importance); each crossing records one
`fact.decayed` event, and a later reference clears it so the next crossing records another.

The package, bottom layer first (each module imports only those above it):

- `terms`: the stemmer, key terms, term matching, optional embedding similarity (pure but `embed`);
- `rounds`: the session's round counter;
- `facts`: register (upsert by key), get, reference, delete, embed the missing;
- `report`: a fact's decay state and the decay report;
- `observe`: what every append runs — rounds, auto-registration, references, the decay sweep;
- `hooks`: around the context engine and the summariser — pinned facts, build and summary checks;
- `promotion`: session end — promotion to long-term memory through experiences.

Callers import the package (`from memory.services import decay`) and use the names below:
- facts_observe_messages: by sessions.messages_append, inside the append transaction;
- facts_for_context / facts_after_build: by the context engine around every build;
- facts_after_summary: by the summariser after it folded messages into a summary;
- facts_on_session_end: by sessions.session_end, inside its transaction.
"""

from memory.services.decay.facts import (
    DERIVED_KEY_TERMS,
    MAX_FACT_CONTENT,
    MAX_KEY_TERMS,
    FactRegistration,
    fact_delete,
    fact_get,
    fact_reference,
    fact_register,
    facts_embed_missing,
)
from memory.services.decay.hooks import PinnedFact, facts_after_build, facts_after_summary, facts_for_context
from memory.services.decay.observe import (
    EVENT_KIND_FACT_TYPES,
    FACT_KEY_METADATA,
    decay_sweep,
    facts_observe_messages,
)
from memory.services.decay.promotion import (
    PROMOTION_KINDS,
    PromotionResult,
    facts_on_session_end,
    facts_promote,
    facts_to_promote,
)
from memory.services.decay.report import (
    CONSIDER_RESTATING,
    NO_ACTION,
    RESTATE_NOW,
    FactStatus,
    fact_references,
    fact_status,
    facts_list,
    recommendation_for,
)
from memory.services.decay.rounds import session_round
from memory.services.decay.terms import STOPWORDS, key_terms

__all__ = [
    "CONSIDER_RESTATING",
    "DERIVED_KEY_TERMS",
    "EVENT_KIND_FACT_TYPES",
    "FACT_KEY_METADATA",
    "MAX_FACT_CONTENT",
    "MAX_KEY_TERMS",
    "NO_ACTION",
    "PROMOTION_KINDS",
    "RESTATE_NOW",
    "STOPWORDS",
    "FactRegistration",
    "FactStatus",
    "PinnedFact",
    "PromotionResult",
    "decay_sweep",
    "fact_delete",
    "fact_get",
    "fact_reference",
    "fact_references",
    "fact_register",
    "fact_status",
    "facts_after_build",
    "facts_after_summary",
    "facts_embed_missing",
    "facts_for_context",
    "facts_list",
    "facts_observe_messages",
    "facts_on_session_end",
    "facts_promote",
    "facts_to_promote",
    "key_terms",
    "recommendation_for",
    "session_round",
]
