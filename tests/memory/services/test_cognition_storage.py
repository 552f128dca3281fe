"""A checkpoint taken with its state stores that state once: the state row derives from it
(no dead copy of a growing document per step), and every read still gives the exact state."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.sites import site
from django.test import RequestFactory

from memory.models import Checkpoint, CognitiveState, Tenant
from memory.services import cognition
from memory.services.sessions import agent_get_or_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(tenant_a: Tenant) -> Any:
    return agent_get_or_create(tenant=tenant_a, external_id="bot")


def history(turns: int) -> dict[str, Any]:
    return {"schema_version": 1, "working_memory": {"messages": [f"turn {n} " * 20 for n in range(turns)]}}


def row_of(agent: Any) -> CognitiveState:
    return CognitiveState.objects.get(agent=agent)


def test_the_state_row_keeps_no_copy_of_a_checkpointed_state(tenant_a: Tenant, agent: Any) -> None:
    for turn in range(1, 26):
        cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=history(turn))
    row = row_of(agent)
    assert row.document == "" and row.checkpoint is not None and row.checkpoint.seq == 25
    assert (
        cognition.state_get(tenant=tenant_a, agent=agent).document["working_memory"]
        == history(25)["working_memory"]
    )


def test_a_derived_state_is_rebuilt_from_the_checkpoints_in_a_fresh_process(
    tenant_a: Tenant, agent: Any
) -> None:
    for turn in range(1, 8):
        cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=history(turn))
    cognition._recent_states.clear()  # as in another web process
    view = cognition.state_get(tenant=tenant_a, agent=agent)
    assert view.document["working_memory"] == history(7)["working_memory"] and view.version == 7
    # and the next checkpoint still diffs against the right state (verified on read)
    cognition._recent_states.clear()
    taken = cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=history(8))
    assert taken.storage == "delta"
    assert cognition.checkpoint_state(checkpoint=taken)["working_memory"] == history(8)["working_memory"]


def test_writes_after_a_derived_state_see_it(tenant_a: Tenant, agent: Any) -> None:
    cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=history(3))
    cognition._recent_states.clear()
    patched = cognition.state_put(
        tenant=tenant_a,
        agent=agent,
        patch=[{"op": "add", "path": "/working_memory/messages/-", "value": "x"}],
    )
    assert patched.document["working_memory"]["messages"][-1] == "x"
    assert len(patched.document["working_memory"]["messages"]) == 4
    assert row_of(agent).document != ""  # a plain state write keeps its document on the row
    taken = cognition.checkpoint_create(tenant=tenant_a, agent=agent)
    assert cognition.checkpoint_state(checkpoint=taken)["working_memory"]["messages"][-1] == "x"


def test_deleting_the_checkpoint_a_state_derives_from_in_the_admin_keeps_the_state(
    tenant_a: Tenant, agent: Any, admin_user: Any
) -> None:
    for turn in range(1, 4):
        cognition.checkpoint_create(tenant=tenant_a, agent=agent, state=history(turn))
    request = RequestFactory().post("/")
    request.user = admin_user
    model_admin = site._registry[Checkpoint]
    model_admin.delete_queryset(request, Checkpoint.objects.filter(agent=agent))
    assert Checkpoint.objects.filter(agent=agent).count() == 0
    view = cognition.state_get(tenant=tenant_a, agent=agent)
    assert view.document["working_memory"] == history(3)["working_memory"]
