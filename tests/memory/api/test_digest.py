"""Session digest API through real HTTP: latest, ?version=, the list of versions, refresh.
Bob never reads Alice's session digests."""

from __future__ import annotations

import pytest

from memory.models import JobIntent
from memory.services.session_digest import DIGEST_JOB, session_digest_update
from memory.services.sessions import MessageInput, messages_append, session_create

pytestmark = pytest.mark.django_db


def make_session(tenant, turns):
    session = session_create(tenant=tenant, agent_external_id="planner", user_id="ana")
    messages_append(tenant=tenant, session=session, items=[MessageInput(role=r, content=t) for r, t in turns])
    return session


def test_latest_version_and_the_list_of_versions(api_a, tenant_a):
    session = make_session(tenant_a, [("user", "I want to cut our cloud bill by 20 percent.")])
    assert api_a.get(f"/api/v1/sessions/{session.public_id}/digest").status_code == 404  # none yet
    session_digest_update(tenant=tenant_a, session=session)
    messages_append(
        tenant=tenant_a,
        session=session,
        items=[MessageInput(role="assistant", content="We decided to move batch jobs to spot instances.")],
    )
    session_digest_update(tenant=tenant_a, session=session)
    latest = api_a.get(f"/api/v1/sessions/{session.public_id}/digest").json()
    assert latest["version"] == 2 and latest["session"] == session.public_id and latest["user_id"] == "ana"
    assert latest["goals"] == [{"text": "I want to cut our cloud bill by 20 percent.", "seq": 1}]
    assert latest["decisions"][0]["text"].startswith("We decided to move batch jobs")
    assert latest["open_questions"] == [] and latest["method"] == "offline"
    assert "Goals:" in latest["text"] and "Decisions:" in latest["text"]
    first = api_a.get(f"/api/v1/sessions/{session.public_id}/digest?version=1").json()
    assert first["version"] == 1 and first["decisions"] == []
    assert api_a.get(f"/api/v1/sessions/{session.public_id}/digest?version=9").status_code == 404
    assert api_a.get(f"/api/v1/sessions/{session.public_id}/digest?version=0").status_code == 422
    page = api_a.get(f"/api/v1/sessions/{session.public_id}/digests?limit=1").json()
    assert [d["version"] for d in page["results"]] == [2] and page["next_cursor"]
    rest = api_a.get(f"/api/v1/sessions/{session.public_id}/digests?cursor={page['next_cursor']}").json()
    assert [d["version"] for d in rest["results"]] == [1] and rest["next_cursor"] is None
    # The one list envelope {items, next}; `results` / `next_cursor` are deprecated aliases.
    assert page["items"] == page["results"] and page["next"] == page["next_cursor"]
    assert rest["items"] == rest["results"] and rest["next"] is None


def test_another_tenants_session_digest_is_404(api_a, api_b, tenant_a):
    session = make_session(tenant_a, [("user", "I want to cut our cloud bill by 20 percent.")])
    session_digest_update(tenant=tenant_a, session=session)
    for path in ("digest", "digests", "digest?version=1"):
        response = api_b.get(f"/api/v1/sessions/{session.public_id}/{path}")
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert api_b.post(f"/api/v1/sessions/{session.public_id}/digest").status_code == 404
    assert api_a.get("/api/v1/sessions/sess_000000000000000000000000/digest").status_code == 404


def test_post_queues_an_update(api_a, tenant_a):
    session = make_session(tenant_a, [("user", "I want to cut our cloud bill by 20 percent.")])
    response = api_a.post(f"/api/v1/sessions/{session.public_id}/digest")
    assert response.status_code == 202 and response.json()["queued"] is True
    [intent] = JobIntent.objects.filter(kind=DIGEST_JOB)  # the job record, run by a worker
    assert intent.tenant_id == tenant_a.pk and intent.payload == {"session": session.pk}
