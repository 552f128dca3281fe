"""The Python client's experience methods, through the real Django app in-process (WSGI)."""

from __future__ import annotations

import pytest

from ctxapp import client as ctx
from memory.models import Experience
from memory.services.experiences import experiences_embed
from memory.services.sessions import session_create, task_create, task_update


@pytest.mark.django_db
def test_client_creates_searches_gives_feedback_promotes_and_distils(alice, tenant_a, tenant_b):
    created = alice.experience_create(
        "Nginx returns 502 Bad Gateway", solution="bind the upstream to 0.0.0.0"
    )
    assert created["outcome"] == "created" and created["embedding"]["status"] == "pending"
    experiences_embed(experience_ids=list(Experience.objects.values_list("pk", flat=True)))
    found = alice.experiences_search("reverse proxy gives a gateway error", limit=3)
    assert found["results"][0]["experience"]["id"] == created["id"]
    assert alice.experience_get(created["id"])["embedding"]["status"] == "completed"
    assert alice.experience_feedback(created["id"], helpful=True)["helpful_count"] == 1
    assert [r["id"] for r in alice.experiences_list(limit=5)["results"]] == [created["id"]]
    promoted = alice.experience_promote("constraint", "deploys", "never deploy on Fridays", user_id="u1")
    assert promoted["scope"] == "user" and promoted["kind"] == "constraint"
    assert alice.experiences_retry_embeddings() == {"requeued": 0}
    session = session_create(tenant=tenant_a, agent_external_id="bot")
    task = task_create(tenant=tenant_a, session=session, input="disk full", metadata={"distill": "none"})
    task_update(tenant=tenant_a, task=task, status="succeeded", output="rotated the logs")
    distilled = alice.task_distill(task.public_id, mode="light")
    assert distilled["experiences"][0]["problem"] == "disk full"
    foreign = Experience.objects.create(
        tenant=tenant_b, problem="bob's", extraction_method="manual", text_hash="0" * 64
    )
    with pytest.raises(ctx.NotFound):
        alice.experience_get(foreign.public_id)
    with pytest.raises(ctx.ValidationFailed):
        alice.experiences_search("x", sources=["graph"])
