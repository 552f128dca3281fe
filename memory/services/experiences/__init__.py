"""Experience memory: create, read, merge, supersede, embed, feedback, promotion, eviction.

Rules (docs/experiences.md explains them):

- An experience is created `pending` and is findable by full text at once; a Celery job embeds
  it (`experiences_embed`), after which it is findable by vector too.
- Only near-identical texts merge, and no text is lost. An exact duplicate (same text, scope,
  user and kind) merges at creation; a near-identical one (cosine >= policy.merge_threshold,
  0.97, AND word-set overlap >= policy.merge_token_overlap, 0.8) merges when it is embedded.
  Merging raises the older row's confidence and use count, appends the newcomer's provenance and
  appends the newcomer's text to the older row's `aliases` (part of its full-text vector, so the
  merged wording stays findable); the newcomer is kept, hidden, with `merged_into`. A row created
  with `merge=False` never merges.
- A contradiction supersedes: when a newer experience has the same problem (problem cosine >=
  policy.supersede_problem_threshold) but a different solution (solution cosine <
  policy.solution_agreement_threshold), the older one gets `superseded_by` and is hidden by
  default; `include_superseded` / `as_of` show history. A caller may also supersede explicitly.
- Nothing in extraction deletes. Capacity eviction (`experiences_evict`) deletes, least
  recently USED first, with a `retention.evicted` event; a caller deletes one row with
  `experience_delete` (`experience.deleted`).

The package, lowest layer first (each module imports only those above it, all at module top):

- `reads`: experience_get, the visible and scope filters, experiences_list (read-only);
- `records`: what every write shares — the input (`BulkItem`), its normalised `Draft`, the new
  row, provenance, event payloads, the exact-duplicate merge (no writes);
- `queue`: the coalesced embedding job intent of the current transaction;
- `reconcile`: merge and supersede, and what an embedded row does with its nearest neighbour;
- `create`: experience_create; `bulk`: experiences_create_bulk and experiences_create_sourced (a
  distillation run's records: check, duplicates, plan, write);
- `promotion`: experiences_promote (into experience_create);
- `embed`: the embedding job body, failures, retries, lost jobs; `reembed`: re-embedding now;
- `feedback`: use and outcome reports; `policy`: the tenant's policy; `retention`: delete, evict.

Callers import the package (`from memory.services import experiences`) or a name from it
(`from memory.services.experiences import experience_create`). Public functions for other
capabilities:

- `experiences_promote(tenant=, user_id=, kind=, key=, content=, source=, session=None)` — the
  decay capability calls it at session end for user preferences, project configuration and
  constraints (kinds `preference`, `project_config`, `constraint`). Idempotent for the same
  content; a new content for the same (user, kind, key) supersedes the old value. Must run inside
  or outside a transaction (it opens its own atomic block).
"""

from memory.services.experiences.bulk import Source, experiences_create_bulk, experiences_create_sourced
from memory.services.experiences.create import experience_create
from memory.services.experiences.embed import (
    experiences_embed,
    experiences_mark_failed,
    experiences_requeue_stale,
    experiences_retry_failed,
)
from memory.services.experiences.feedback import experience_feedback, experiences_touch
from memory.services.experiences.policy import POLICY_FIELDS, experience_policy_get, experience_policy_update
from memory.services.experiences.promotion import experiences_promote
from memory.services.experiences.reads import (
    experience_get,
    experiences_list,
    scope_filter,
    visible_filter,
)
from memory.services.experiences.reconcile import (
    RECONCILE_CANDIDATE_FLOOR,
    experience_merge,
    experience_supersede,
    merge_allowed,
    token_overlap,
)
from memory.services.experiences.records import (
    KIND_LABELS,
    PROMOTABLE_KINDS,
    BulkItem,
    CreateResult,
    experience_input_errors,
)
from memory.services.experiences.reembed import (
    REEMBED_PROGRESS_EVERY_SECONDS,
    ReembedResult,
    experiences_reembed,
    experiences_reembed_batch,
)
from memory.services.experiences.retention import (
    DeleteResult,
    experience_delete,
    experiences_evict,
    experiences_evict_all,
)

__all__ = [
    "KIND_LABELS",
    "POLICY_FIELDS",
    "PROMOTABLE_KINDS",
    "RECONCILE_CANDIDATE_FLOOR",
    "REEMBED_PROGRESS_EVERY_SECONDS",
    "BulkItem",
    "CreateResult",
    "DeleteResult",
    "ReembedResult",
    "Source",
    "experience_create",
    "experience_delete",
    "experience_feedback",
    "experience_get",
    "experience_input_errors",
    "experience_merge",
    "experience_policy_get",
    "experience_policy_update",
    "experience_supersede",
    "experiences_create_bulk",
    "experiences_create_sourced",
    "experiences_embed",
    "experiences_evict",
    "experiences_evict_all",
    "experiences_list",
    "experiences_mark_failed",
    "experiences_promote",
    "experiences_reembed",
    "experiences_reembed_batch",
    "experiences_requeue_stale",
    "experiences_retry_failed",
    "experiences_touch",
    "merge_allowed",
    "scope_filter",
    "token_overlap",
    "visible_filter",
]
