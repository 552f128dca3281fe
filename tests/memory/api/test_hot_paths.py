"""The hot paths stay cheap and keep their guarantees: API-key cache with revocation honoured at
once, one-statement idempotency records, pinned statement counts (bench/bench_peers.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from memory.models import (
    Agent,
    ApiKey,
    Checkpoint,
    Event,
    IdempotencyRecord,
    MemoryIndexState,
    Message,
    Session,
    Tenant,
)
from memory.services.state_fold import fold_event_rows, fold_events, fold_initial, reducers_get
from memory.services.tenancy import api_key_create, api_key_revoke, api_keys_changed

pytestmark = pytest.mark.django_db


def key_queries(client: Any, path: str = "/api/v1/tenant") -> tuple[int, int]:
    """(status, statements that read the API-key table) of one GET."""
    with CaptureQueriesContext(connection) as queries:
        status = client.get(path).status_code
    return status, sum(1 for q in queries.captured_queries if ApiKey._meta.db_table in q["sql"])


def session_of(api: Any) -> str:
    return str(api.post("/api/v1/sessions", {"agent": "bot"}, format="json").json()["id"])


# --- API-key cache -------------------------------------------------------------------------------


def test_a_warm_key_is_not_looked_up_again(api_a: Any) -> None:
    assert key_queries(api_a)[0] == 200
    assert key_queries(api_a) == (200, 0)


def test_a_revoked_key_is_refused_at_once_though_it_was_cached(api_a: Any) -> None:
    assert key_queries(api_a)[0] == 200
    api_key_revoke(api_key=api_a.api_key)
    response = api_a.get("/api/v1/tenant")
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]["message"]


def test_a_key_revoked_through_the_api_is_refused_at_once(
    api_a: Any, make_client: Any, tenant_a: Tenant
) -> None:
    admin = make_client(tenant_a, scopes=["admin"])
    assert key_queries(api_a)[0] == 200
    assert admin.delete(f"/api/v1/tenant/api-keys/{api_a.api_key.prefix}").status_code == 200
    assert api_a.get("/api/v1/tenant").status_code == 401


def test_a_revocation_by_another_process_is_honoured_at_once(api_a: Any) -> None:
    # Another process (the admin site, a CLI) revokes: its row change plus its new generation.
    assert key_queries(api_a)[0] == 200
    ApiKey.objects.filter(pk=api_a.api_key.pk).update(revoked_at="2026-01-01T00:00:00Z")
    api_keys_changed()
    assert api_a.get("/api/v1/tenant").status_code == 401


def test_a_disabled_tenant_is_refused_at_once_though_its_key_was_cached(api_a: Any, tenant_a: Tenant) -> None:
    assert key_queries(api_a)[0] == 200
    tenant_a.is_active = False
    tenant_a.save(update_fields=["is_active"])  # the admin's way: a save (signal → new generation)
    assert api_a.get("/api/v1/tenant").status_code == 401


def test_the_cache_can_be_turned_off(api_a: Any, settings: Any) -> None:
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, api_key_cache_seconds=0)
    assert key_queries(api_a)[0] == 200
    assert key_queries(api_a) == (200, 1)
    ApiKey.objects.filter(pk=api_a.api_key.pk).update(revoked_at="2026-01-01T00:00:00Z")  # no new generation
    assert api_a.get("/api/v1/tenant").status_code == 401


def test_a_wrong_secret_with_a_cached_prefix_is_refused(api_a: Any, anon: Any) -> None:
    assert key_queries(api_a)[0] == 200
    anon.credentials(HTTP_AUTHORIZATION=f"Bearer {api_a.secret[:-4]}xxxx")
    assert anon.get("/api/v1/tenant").status_code == 401


def test_another_tenants_cached_key_never_reaches_this_tenants_data(api_a: Any, api_b: Any) -> None:
    session = session_of(api_a)
    assert api_b.get(f"/api/v1/sessions/{session}").status_code == 404
    assert api_b.get(f"/api/v1/sessions/{session}").status_code == 404  # warm cache, same answer
    assert api_a.get(f"/api/v1/sessions/{session}").status_code == 200


# --- statement counts (upper bounds: the hot paths must not regress) ----------------------------
# Counted inside the test's transaction, so the view's atomic block adds a SAVEPOINT/RELEASE pair.


def test_an_append_with_an_idempotency_key_costs_at_most_seven_statements(
    api_a: Any, django_assert_max_num_queries: Any
) -> None:
    session = session_of(api_a)
    path = f"/api/v1/sessions/{session}/messages"
    api_a.post(path, {"role": "user", "content": "warm-up"}, format="json", HTTP_IDEMPOTENCY_KEY="w")
    # key: cached; the session locked, the message, the session's counters, the stream's seqs, the
    # event, decay's round counter (user turns only), the idempotency record — plus the view's
    # SAVEPOINT/RELEASE inside the test's transaction.
    for role in ("user", "assistant"):
        with django_assert_max_num_queries(7 + 2):
            response = api_a.post(
                path, {"role": role, "content": "hello"}, format="json", HTTP_IDEMPOTENCY_KEY=f"k-{role}"
            )
        assert response.status_code == 201


@pytest.mark.django_db(transaction=True)  # the after-commit work runs at the request's own commit
def test_around_an_append_no_queued_drain_is_claimed_again(api_a: Any) -> None:
    # The whole request with its after-commit work: the rate limits count in Redis, not in SQL;
    # a drain already queued is read, not claimed again.
    path = f"/api/v1/sessions/{session_of(api_a)}/messages"
    api_a.post(path, {"role": "user", "content": "warm-up"}, format="json")  # queues a drain
    with CaptureQueriesContext(connection) as queries:
        response = api_a.post(
            path, {"role": "user", "content": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="k"
        )
    assert response.status_code == 201
    state_table = MemoryIndexState._meta.db_table
    after_commit = [q["sql"] for q in queries.captured_queries if state_table in q["sql"]]
    assert [sql.split()[0] for sql in after_commit] == ["SELECT"], after_commit
    assert MemoryIndexState.objects.get(pk=1).drain_scheduled


def test_a_batch_of_100_costs_as_many_statements_as_one_message(
    api_a: Any, django_assert_max_num_queries: Any
) -> None:
    session = session_of(api_a)
    path = f"/api/v1/sessions/{session}/messages"
    api_a.post(path, {"role": "user", "content": "warm-up"}, format="json")
    body = {"messages": [{"role": "user", "content": f"m{i}"} for i in range(100)]}
    with django_assert_max_num_queries(7 + 2):
        response = api_a.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY="batch")
    assert response.status_code == 201
    assert response.json()["last_seq"] - response.json()["first_seq"] == 99


def test_a_checkpoint_with_its_state_costs_at_most_eight_statements(
    api_a: Any, django_assert_max_num_queries: Any
) -> None:
    state: dict[str, Any] = {"schema_version": 1, "working_memory": {f"e{i}": "x" * 50 for i in range(50)}}
    path = "/api/v1/agents/bot/checkpoints"
    session_of(api_a)  # creates the agent
    for step in range(3):
        state["working_memory"]["e0"] = f"step {step}"
        api_a.post(path, {"state": state}, format="json", HTTP_IDEMPOTENCY_KEY=f"warm-{step}")
    state["working_memory"]["e1"] = "changed"
    # agent; state row (locked, with the policy and the previous checkpoint's fold); the stream's
    # seqs; state.updated + checkpoint.created; the checkpoint; the previous checkpoint's fold
    # cleared; the state row (state, pointer); the idempotency record — plus two SAVEPOINT/RELEASE
    # pairs (the view's and the service's, inside the test's transaction). The previous
    # checkpoint's state is not rebuilt from its deltas (its hash matches the stored state), and
    # its stored fold is continued with the two new events (no reducers, folds or events read).
    with django_assert_max_num_queries(8 + 4):
        response = api_a.post(path, {"state": state}, format="json", HTTP_IDEMPOTENCY_KEY="measured")
    assert response.status_code == 201
    assert response.json()["storage"] == "delta"
    assert api_a.get(f"{path}/{response.json()['seq']}").json()["state"]["working_memory"]["e1"] == "changed"


def test_a_continued_fold_equals_the_fold_of_the_whole_stream(api_a: Any, tenant_a: Tenant) -> None:
    session = session_of(api_a)
    agent = Agent.objects.get(tenant=tenant_a, external_id="bot")
    reducers = [{"event_type": "agent.note", "op": "append", "target": "notes", "source": "text"}]
    assert api_a.put("/api/v1/agents/bot/reducers", {"reducers": reducers}, format="json").status_code == 200
    for step in range(6):  # checkpoints straight after each other, and with other events in between
        state = {"schema_version": 1, "working_memory": {"n": step}}
        checkpoint = api_a.post("/api/v1/agents/bot/checkpoints", {"state": state}, format="json")
        assert checkpoint.status_code == 201
        if step in (2, 4):
            note = {"type": "agent.note", "payload": {"text": f"note {step}"}}
            assert api_a.post("/api/v1/agents/bot/events", note, format="json").status_code == 201
            message = api_a.post(
                f"/api/v1/sessions/{session}/messages",
                {"role": "user", "content": f"turn {step}"},
                format="json",
            )
            assert message.status_code == 201
    newest = Checkpoint.objects.filter(agent=agent).order_by("-seq").first()
    assert newest is not None
    rows = fold_event_rows(tenant=tenant_a, agent=agent, after=0, through=newest.covers_event_seq)
    from_scratch = fold_events(fold_initial(), rows, reducers_get(tenant=tenant_a, agent=agent))
    assert json.loads(newest.fold_state) == from_scratch
    assert from_scratch["custom"]["notes"] == ["note 2", "note 4"]


# --- idempotency: one statement, still at most once --------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicates_write_once_and_both_get_the_same_answer() -> None:
    from rest_framework.test import APIClient

    tenant = Tenant.objects.create(name="t", slug="concurrent")
    _, secret = api_key_create(tenant=tenant, name="k")
    setup = APIClient()
    setup.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    session = session_of(setup)
    barrier = threading.Barrier(4)
    answers: list[tuple[int, Any]] = []

    def send() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        try:
            barrier.wait(timeout=30)
            response = client.post(
                f"/api/v1/sessions/{session}/messages",
                {"role": "user", "content": "once"},
                format="json",
                HTTP_IDEMPOTENCY_KEY="dup",
            )
            answers.append((response.status_code, response.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(answers) == 4
    assert {status for status, _ in answers} == {201}
    assert len({body["seq"] for _, body in answers}) == 1
    stored = Session.objects.get(public_id=session)
    assert stored.message_seq == 1 and Message.objects.filter(session=stored).count() == 1
    assert Event.objects.filter(session=stored, type="message.added").count() == 1
    assert IdempotencyRecord.objects.filter(tenant=tenant, key="dup").count() == 1


def test_a_retried_append_to_a_session_ended_since_replays_the_original(api_a: Any) -> None:
    session = session_of(api_a)
    path = f"/api/v1/sessions/{session}/messages"
    first = api_a.post(path, {"role": "user", "content": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="late")
    assert api_a.post(f"/api/v1/sessions/{session}/end").status_code == 200
    again = api_a.post(path, {"role": "user", "content": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="late")
    assert again.status_code == first.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    fresh = api_a.post(path, {"role": "user", "content": "hi"}, format="json", HTTP_IDEMPOTENCY_KEY="new")
    assert fresh.status_code == 409 and fresh.json()["error"]["code"] == "session_ended"


def test_a_retried_costly_write_is_replayed_without_running_again(api_a: Any) -> None:
    # Writes off the hot path reserve their key first: the retry does not redo the work.
    first = api_a.post("/api/v1/sessions", {"agent": "bot"}, format="json", HTTP_IDEMPOTENCY_KEY="s")
    with CaptureQueriesContext(connection) as queries:
        again = api_a.post("/api/v1/sessions", {"agent": "bot"}, format="json", HTTP_IDEMPOTENCY_KEY="s")
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert not any(Session._meta.db_table in q["sql"] for q in queries.captured_queries)


def test_a_retry_rolls_back_its_own_run_leaving_seqs_gapless(api_a: Any) -> None:
    session = session_of(api_a)
    path = f"/api/v1/sessions/{session}/messages"
    api_a.post(path, {"role": "user", "content": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="a")
    api_a.post(path, {"role": "user", "content": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="a")
    third = api_a.post(path, {"role": "user", "content": "b"}, format="json", HTTP_IDEMPOTENCY_KEY="b")
    assert third.json()["seq"] == 2
    stored = Message.objects.filter(session__public_id=session).order_by("seq")
    assert list(stored.values_list("seq", flat=True)) == [1, 2]


def test_reading_the_state_and_a_delta_checkpoint_costs_two_and_four_statements(
    api_a: Any, django_assert_max_num_queries: Any
) -> None:
    session_of(api_a)
    state: dict[str, Any] = {"schema_version": 1, "working_memory": {"n": 0}}
    for step in range(5):
        state["working_memory"]["n"] = step
        assert (
            api_a.post("/api/v1/agents/bot/checkpoints", {"state": state}, format="json").status_code == 201
        )
    with django_assert_max_num_queries(2):  # agent; state row with its checkpoint's id and seq
        assert api_a.get("/api/v1/agents/bot/state").json()["working_memory"]["n"] == 4
    # agent; checkpoint; its delta chain down to the full snapshot (one query); the agent it names
    with django_assert_max_num_queries(4):
        response = api_a.get("/api/v1/agents/bot/checkpoints/5")
    assert response.json()["storage"] == "delta" and response.json()["state"]["working_memory"]["n"] == 4
