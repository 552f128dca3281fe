"""Celery tasks of the cognition capability (thin: ids in, one service call)."""

from __future__ import annotations

from celery import shared_task

from memory.models import Agent
from memory.services import cognition

SCHEDULE: dict = {
    "cognition-prune-checkpoints": {
        "task": "memory.tasks.cognition.checkpoints_prune_all",
        "schedule": 3600.0,
    },
}


@shared_task(acks_late=True)
def checkpoints_prune_agent(agent_id: int) -> int:
    """Apply the tenant's checkpoint retention to one agent. Idempotent; returns how many were pruned."""
    agent = Agent.objects.filter(pk=agent_id).select_related("tenant").first()
    if agent is None:  # deleted meanwhile: nothing to do
        return 0
    return len(cognition.checkpoints_prune(tenant=agent.tenant, agent=agent))


@shared_task(acks_late=True)
def checkpoints_prune_all() -> int:
    """Queue a prune for every agent holding more checkpoints than its tenant keeps. Returns how many."""
    agent_ids = cognition.agents_with_prunable_checkpoints()
    for agent_id in agent_ids:
        checkpoints_prune_agent.delay(agent_id)
    return len(agent_ids)
