"""The three context layers of a task: shared context, private context, inter-agent messages."""

from __future__ import annotations

import json

import pytest

from memory.exceptions import NotFound, VersionConflict
from memory.models import Event, IpcReceipt, PrivateContext
from memory.services import layers
from memory.services.sessions import agent_get_or_create, task_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def agents(tenant_a):
    return [agent_get_or_create(tenant=tenant_a, external_id=name) for name in ("alpha", "beta", "gamma")]


@pytest.fixture
def task(tenant_a, agents):
    return task_create(tenant=tenant_a, agent_external_id="alpha", title="joint work")


def test_shared_context_put_patch_append_and_versions(tenant_a, agents, task):
    alpha, beta, _ = agents
    put = layers.shared_context_write(
        tenant=tenant_a,
        task=task,
        values={"goal": "g", "constraints": ["c"], "artifacts": ["a1"]},
        replace=True,
        agent=alpha,
    )
    assert put["version"] == 1 and put["updated_by"] == "alpha"
    patched = layers.shared_context_write(
        tenant=tenant_a,
        task=task,
        values={"goal": "g2"},
        append={"decisions": ["d1"]},
        replace=False,
        agent=beta,
    )
    assert patched["goal"] == "g2" and patched["constraints"] == ["c"] and patched["decisions"] == ["d1"]
    with pytest.raises(VersionConflict):
        layers.shared_context_write(
            tenant=tenant_a, task=task, values={"goal": "x"}, replace=False, expected_version=1
        )
    replaced = layers.shared_context_write(tenant=tenant_a, task=task, values={"goal": "only"}, replace=True)
    assert replaced["constraints"] == [] and replaced["decisions"] == [] and replaced["version"] == 3
    updates = Event.objects.filter(type="task_context.updated").order_by("id")
    assert [e.stream for e in updates] == ["agent:alpha", "agent:beta", "tenant"]
    assert updates[1].payload["changed"] == ["goal", "decisions"]


def test_private_context_is_per_agent_and_its_events_carry_no_content(tenant_a, agents, task):
    alpha, beta, _ = agents
    layers.private_context_put(tenant=tenant_a, task=task, agent=alpha, data={"plan": "alpha's secret"})
    assert layers.private_context_get(tenant=tenant_a, task=task, agent=beta).data == {}
    assert layers.private_context_get(tenant=tenant_a, task=task, agent=alpha).data == {
        "plan": "alpha's secret"
    }
    assert PrivateContext.objects.count() == 1
    event = Event.objects.get(type="private_context.updated")
    assert event.stream == "agent:alpha" and "secret" not in json.dumps(event.payload)


def test_messages_direct_and_broadcast_with_per_reader_read_state(tenant_a, agents, task):
    alpha, beta, gamma = agents
    direct = layers.ipc_send(tenant=tenant_a, task=task, sender=alpha, recipient=beta, body={"q": "ready?"})
    everyone = layers.ipc_send(tenant=tenant_a, task=task, sender=alpha, recipient=None, body="standup")
    ids = lambda qs: [m.public_id for m in qs.order_by("pk")]  # noqa: E731
    assert ids(layers.ipc_list(tenant=tenant_a, task=task, agent=beta, box="inbox")) == [
        direct.public_id,
        everyone.public_id,
    ]
    assert ids(layers.ipc_list(tenant=tenant_a, task=task, agent=gamma)) == [everyone.public_id]
    assert ids(layers.ipc_list(tenant=tenant_a, task=task, agent=alpha, box="inbox")) == []
    assert ids(layers.ipc_list(tenant=tenant_a, task=task, agent=alpha, box="sent")) == ids(
        layers.ipc_list(tenant=tenant_a, task=task, agent=beta)
    )
    assert layers.ipc_mark_read(tenant=tenant_a, task=task, agent=beta) == 2
    assert layers.ipc_mark_read(tenant=tenant_a, task=task, agent=beta) == 0  # idempotent
    assert ids(layers.ipc_list(tenant=tenant_a, task=task, agent=gamma, unread_only=True)) == [
        everyone.public_id
    ]
    with pytest.raises(NotFound):  # gamma cannot mark (or learn about) beta's direct message
        layers.ipc_mark_read(tenant=tenant_a, task=task, agent=gamma, message_ids=[direct.public_id])
    assert IpcReceipt.objects.count() == 2
    assert (
        Event.objects.filter(type="ipc.sent").count() == 2
        and Event.objects.filter(type="ipc.read").count() == 1
    )
    assert "ready?" not in json.dumps(list(Event.objects.values_list("payload", flat=True)))


def test_context_view_is_shared_plus_own_private_plus_inbox_and_returns_copies(tenant_a, agents, task):
    alpha, beta, _ = agents
    layers.shared_context_write(tenant=tenant_a, task=task, values={"constraints": ["c1"]}, replace=False)
    layers.private_context_put(tenant=tenant_a, task=task, agent=alpha, data={"notes": ["n1"]})
    layers.private_context_put(tenant=tenant_a, task=task, agent=beta, data={"notes": ["beta only"]})
    layers.ipc_send(tenant=tenant_a, task=task, sender=beta, recipient=alpha, body={"items": [1]})
    view = layers.context_view(tenant=tenant_a, task=task, agent=alpha)
    assert view["shared"]["constraints"] == ["c1"]
    assert view["private"]["data"] == {"notes": ["n1"]}
    assert [m["body"] for m in view["inbox"]] == [{"items": [1]}] and view["unread"] == 1
    assert "beta only" not in json.dumps(view)
    view["shared"]["constraints"].append("mutated")
    view["private"]["data"]["notes"].append("mutated")
    view["inbox"][0]["body"]["items"].append("mutated")
    again = layers.context_view(tenant=tenant_a, task=task, agent=alpha)
    assert again["shared"]["constraints"] == ["c1"]
    assert again["private"]["data"] == {"notes": ["n1"]}
    assert again["inbox"][0]["body"] == {"items": [1]}
    assert again["unread"] == 1  # viewing does not mark read
