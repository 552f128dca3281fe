"""Cognitive state and checkpoints: versioned writes, delta storage, diff, restore, retention.

A state is a JSON document of schema 1 (`STATE_FIELDS`). Checkpoints are immutable snapshots of
it with a gapless per-agent seq; each is stored in full or as a delta (JSON-path operations, the
same ones the diff endpoint shows) from the checkpoint before it, with a full snapshot every K.
Pruning re-bases the deltas that pointed at a pruned checkpoint before deleting it, and every
reconstruction is verified against the SHA-256 recorded when the checkpoint was taken.

The modules, lowest first (each imports only those above it):

- `jsondiff`: JSON text, hash, the JSON-path diff and its patch (pure);
- `schema`: the state document, validation, schema upgrades, size limit (pure);
- `storage`: full/delta encoding of a checkpoint and its verified reconstruction;
- `state`: the current state (get, put, patch) and the per-process cache of recent states;
- `checkpoints`: take, get, list, diff, restore (uses memory/services/state_fold.py for the fold);
- `pruning`: retention;
- `blobs`: large values kept beside checkpoints and events, by content digest.

This package re-exports the names the rest of the code uses: `from memory.services import cognition`.
"""

from memory.services.cognition.blobs import blob_get, blob_put
from memory.services.cognition.checkpoints import (
    CheckpointDiff,
    checkpoint_create,
    checkpoint_diff,
    checkpoint_get,
    checkpoint_latest,
    checkpoints_list,
    state_restore,
)
from memory.services.cognition.jsondiff import (
    json_diff,
    json_patch_apply,
    json_pointer,
    json_same,
    json_sha256,
    json_text,
)
from memory.services.cognition.pruning import (
    agents_with_prunable_checkpoints,
    checkpoints_prune,
    checkpoints_to_keep,
)
from memory.services.cognition.schema import (
    LEGACY_FIELDS,
    READ_ONLY_FIELDS,
    STATE_FIELDS,
    StateInput,
    empty_state,
    state_check_size,
    state_input_parse,
    state_load,
    state_normalize,
    state_patched,
)
from memory.services.cognition.state import (
    RECENT_STATES_MAX_BYTES,
    StateView,
    _recent_states,
    state_get,
    state_materialize_before_delete,
    state_put,
)
from memory.services.cognition.storage import checkpoint_state

__all__ = [
    "LEGACY_FIELDS",
    "READ_ONLY_FIELDS",
    "RECENT_STATES_MAX_BYTES",
    "STATE_FIELDS",
    "CheckpointDiff",
    "StateInput",
    "StateView",
    "_recent_states",
    "agents_with_prunable_checkpoints",
    "blob_get",
    "blob_put",
    "checkpoint_create",
    "checkpoint_diff",
    "checkpoint_get",
    "checkpoint_latest",
    "checkpoint_state",
    "checkpoints_list",
    "checkpoints_prune",
    "checkpoints_to_keep",
    "empty_state",
    "json_diff",
    "json_patch_apply",
    "json_pointer",
    "json_same",
    "json_sha256",
    "json_text",
    "state_check_size",
    "state_get",
    "state_input_parse",
    "state_load",
    "state_materialize_before_delete",
    "state_normalize",
    "state_patched",
    "state_put",
    "state_restore",
]
