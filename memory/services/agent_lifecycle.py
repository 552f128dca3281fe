"""An agent's end: deleting an agent with everything kept under it.

Integrations that map their own objects onto agents (a LangGraph thread is an agent, see
ctxapp/integrations/langgraph.py) delete them here, so a deleted thread leaves nothing behind.
"""

from __future__ import annotations

from django.db import transaction

from memory.exceptions import NotFound
from memory.models import Agent, Checkpoint, Event, Session, Tenant
from memory.services import recorder


def agent_delete(*, tenant: Tenant, agent: Agent) -> dict[str, int]:
    """Delete the agent: its sessions (with their messages), state, checkpoints, reducers and the
    events of its own stream, which would otherwise come back under an agent of the same id.

    Events elsewhere that name it (the tenant stream) keep their payload, with an empty agent
    link. Records `agent.deleted` on the tenant stream with what went. NotFound if it is gone.
    """
    with transaction.atomic():
        locked = Agent.objects.select_for_update().filter(pk=agent.pk, tenant=tenant).first()
        if locked is None:
            raise NotFound.of("agent", agent.external_id)
        counts = {
            "sessions": Session.objects.filter(tenant=tenant, agent=locked).count(),
            "checkpoints": Checkpoint.objects.filter(agent=locked).count(),
        }
        counts["events"], _ = Event.objects.filter(tenant=tenant, stream=recorder.stream_key(locked)).delete()
        locked.delete()
        recorder.event_append(
            tenant=tenant, type="agent.deleted", payload={"agent": agent.external_id, **counts}
        )
        return counts
