"""Experience memory services: create, embed, merge, supersede (with as_of), feedback, promotion,
capacity eviction. Real PostgreSQL + pgvector and the real local MiniLM model."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.utils import timezone

from memory.models import EmbeddingCache, Event, Experience, ExperiencePolicy, JobIntent
from memory.services import jobs
from memory.services.experience_search import experiences_search
from memory.services.experiences import (
    experience_create,
    experience_feedback,
    experience_get,
    experiences_embed,
    experiences_evict,
    experiences_list,
    experiences_mark_failed,
    experiences_promote,
    experiences_retry_failed,
)
from memory.tasks.experiences import experiences_embed_task

pytestmark = pytest.mark.django_db

CRASH = "Pod stuck in CrashLoopBackOff after deploy"
CONFIGMAP = (
    "The DATABASE_URL environment variable was missing from the ConfigMap; added it and rolled out again"
)


def create(tenant, problem=CRASH, solution=CONFIGMAP, **kwargs):
    return experience_create(tenant=tenant, problem=problem, solution=solution, **kwargs).experience


def embed(*experiences):
    return experiences_embed(experience_ids=[e.pk for e in experiences])


def events(tenant, type_):
    return list(Event.objects.filter(tenant=tenant, type=type_).order_by("pk"))


def test_a_new_experience_is_pending_and_found_by_full_text_at_once(tenant_a):
    experience = create(tenant_a)
    assert experience.embedding_status == "pending"
    assert experience.embedding is None
    [event] = events(tenant_a, "experience.created")
    assert event.payload["experience"] == experience.public_id
    hits = experiences_search(tenant=tenant_a, query="CrashLoopBackOff", sources=["text"]).hits
    assert [h.experience.public_id for h in hits] == [experience.public_id]


def test_embedding_completes_once_with_model_and_dimension(tenant_a):
    experience = create(tenant_a)
    assert embed(experience) == 1
    experience.refresh_from_db()
    assert experience.embedding_status == "completed"
    assert experience.embedding_model == "all-MiniLM-L6-v2-onnx-int8"
    assert experience.embedding_dimensions == 384 and len(experience.embedding) == 384
    assert experience.embedding_attempts == 1 and experience.embedded_at is not None
    # A redelivered job finds nothing pending: no second write, no second event.
    assert embed(experience) == 0
    experience.refresh_from_db()
    assert experience.embedding_attempts == 1
    assert len(events(tenant_a, "experience.embedded")) == 1


def test_the_same_text_is_cached_per_tenant(tenant_a, tenant_b):
    first, second = create(tenant_a), create(tenant_b)
    embed(first, second)
    # The whole text and the problem alone, for each tenant: no tenant's cache answers another's.
    assert EmbeddingCache.objects.filter(tenant=tenant_a).count() == 2
    assert EmbeddingCache.objects.filter(tenant=tenant_b).count() == 2
    first.refresh_from_db()
    second.refresh_from_db()
    assert list(first.embedding) == list(second.embedding)


def test_a_near_identical_duplicate_merges_into_the_older_one(tenant_a):
    older = create(tenant_a, confidence=0.6)
    embed(older)
    newer = create(tenant_a, solution=CONFIGMAP.replace("environment", "env"), confidence=0.6)
    embed(newer)
    older.refresh_from_db()
    newer.refresh_from_db()
    assert newer.merged_into_id == older.pk and newer.merged_at is not None
    assert older.confidence > 0.6 and older.use_count == 1 and older.merge_count == 1
    assert any(p.get("merged_from") == newer.public_id for p in older.provenance)
    [merged] = events(tenant_a, "experience.merged")
    assert merged.payload["experience"] == older.public_id and merged.payload["merged"] == newer.public_id
    assert merged.payload["similarity"] >= 0.97
    # Only the older one is visible; nothing was deleted; the newer wording is an alias of it.
    assert [e.pk for e in experiences_list(tenant=tenant_a)] == [older.pk]
    assert Experience.objects.filter(tenant=tenant_a).count() == 2
    assert "env variable" in older.aliases


def test_a_paraphrase_is_kept_as_its_own_experience(tenant_a):
    older = create(tenant_a, confidence=0.6)
    embed(older)
    newer = create(
        tenant_a,
        problem="Pod in CrashLoopBackOff right after deploying",
        solution="DATABASE_URL env var missing from the new ConfigMap, added it and redeployed",
        confidence=0.6,
    )
    embed(newer)
    newer.refresh_from_db()
    assert newer.merged_into_id is None and newer.superseded_by_id is None
    assert {e.pk for e in experiences_list(tenant=tenant_a)} == {older.pk, newer.pk}
    assert events(tenant_a, "experience.merged") == []


def test_an_exact_duplicate_merges_at_creation_and_a_rerun_is_unchanged(tenant_a):
    first = experience_create(tenant=tenant_a, problem=CRASH, solution=CONFIGMAP, confidence=0.5)
    again = experience_create(tenant=tenant_a, problem=CRASH, solution=CONFIGMAP, confidence=0.5)
    assert first.outcome == "created" and again.outcome == "merged"
    assert again.experience.pk == first.experience.pk
    assert again.experience.confidence > 0.5
    assert Experience.objects.filter(tenant=tenant_a).count() == 1


def test_a_contradiction_supersedes_the_older_and_as_of_shows_history(tenant_a):
    older = create(tenant_a)
    embed(older)
    before = timezone.now()
    newer = create(
        tenant_a, solution="The liveness probe timeout was too short; raised initialDelaySeconds to 30"
    )
    embed(newer)
    older.refresh_from_db()
    assert older.superseded_by_id == newer.pk and older.superseded_at is not None
    [event] = events(tenant_a, "experience.superseded")
    assert event.payload["superseded_by"] == newer.public_id and event.payload["reason"] == "contradiction"
    assert event.payload["problem_similarity"] >= 0.85 > event.payload["solution_similarity"]

    def found(**kwargs):
        return {
            h.experience.pk
            for h in experiences_search(tenant=tenant_a, query="pod crash loop", **kwargs).hits
        }

    assert found() == {newer.pk}
    assert found(include_superseded=True) == {older.pk, newer.pk}
    assert found(as_of=before) == {older.pk}
    assert found(as_of=timezone.now()) == {newer.pk}
    assert {e.pk for e in experiences_list(tenant=tenant_a, as_of=before)} == {older.pk}


def test_an_explicit_supersede_needs_no_embedding(tenant_a):
    older = create(tenant_a)
    newer = create(tenant_a, solution="Use a Secret, not a ConfigMap, for DATABASE_URL", supersedes=older)
    older.refresh_from_db()
    assert older.superseded_by_id == newer.pk
    assert experience_get(tenant=tenant_a, experience_id=older.public_id).superseded_by == newer


def test_unrelated_experiences_neither_merge_nor_supersede(tenant_a):
    first = create(tenant_a)
    second = create(
        tenant_a, problem="Nginx returns 502 Bad Gateway", solution="bind the upstream to 0.0.0.0"
    )
    embed(first, second)
    assert experiences_list(tenant=tenant_a).count() == 2
    assert not events(tenant_a, "experience.merged") and not events(tenant_a, "experience.superseded")


def test_failed_embeddings_keep_their_reason_and_retry_requeues_them(tenant_a):
    experience = create(tenant_a)
    assert experiences_mark_failed(experience_ids=[experience.pk], reason="HTTP 500 from the endpoint") == 1
    experience.refresh_from_db()
    assert experience.embedding_status == "failed"
    assert experience.embedding_error == "HTTP 500 from the endpoint"
    assert (
        events(tenant_a, "experience.embedding_failed")[0].payload["reason"] == "HTTP 500 from the endpoint"
    )
    assert experiences_retry_failed(tenant=tenant_a) == 1
    experience.refresh_from_db()
    assert experience.embedding_status == "pending" and experience.embedding_error == ""
    assert embed(experience) == 1


def test_feedback_is_counted_and_recorded(tenant_a):
    experience = create(tenant_a)
    experience_feedback(tenant=tenant_a, experience=experience, helpful=True, note="fixed my pod")
    experience_feedback(tenant=tenant_a, experience=experience, helpful=False)
    experience.refresh_from_db()
    assert (experience.helpful_count, experience.unhelpful_count) == (1, 1)
    assert [e.payload["helpful"] for e in events(tenant_a, "experience.feedback")] == [True, False]


def test_promotion_is_user_scoped_idempotent_and_a_new_value_supersedes(tenant_a):
    first = experiences_promote(
        tenant=tenant_a, user_id="u1", kind="preference", key="indent", content="tabs", source="session end"
    )
    assert first.outcome == "created"
    promoted = first.experience
    assert (promoted.scope, promoted.user_id, promoted.kind, promoted.extraction_method) == (
        "user", "u1", "preference", "promoted",
    )  # fmt: skip
    again = experiences_promote(
        tenant=tenant_a, user_id="u1", kind="preference", key="indent", content="tabs", source="session end"
    )
    assert again.outcome == "unchanged" and again.experience.pk == promoted.pk
    changed = experiences_promote(
        tenant=tenant_a, user_id="u1", kind="preference", key="indent", content="4 spaces"
    )
    promoted.refresh_from_db()
    assert promoted.superseded_by_id == changed.experience.pk
    assert [e.solution for e in experiences_list(tenant=tenant_a, kind="preference")] == ["4 spaces"]
    # Another user never sees u1's preference.
    assert not experiences_search(tenant=tenant_a, query="indent", user_id="u2", sources=["text"]).hits
    assert experiences_search(tenant=tenant_a, query="indent", user_id="u1", sources=["text"]).hits


def test_capacity_evicts_the_least_recently_used(tenant_a):
    policy = ExperiencePolicy.for_tenant(tenant_a)
    policy.capacity = 3
    policy.save(update_fields=["capacity"])
    now = timezone.now()
    rows = [create(tenant_a, problem=f"problem number {i}", solution=f"solution {i}") for i in range(5)]
    for i, row in enumerate(rows):  # used in the order 0..4, except row 0 used last of all
        row.last_used_at = now - timedelta(hours=10 - i) if i else now
        row.save(update_fields=["last_used_at"])
    assert experiences_evict(tenant=tenant_a) == 2
    assert set(Experience.objects.filter(tenant=tenant_a).values_list("pk", flat=True)) == {
        rows[0].pk, rows[3].pk, rows[4].pk,
    }  # fmt: skip
    [event] = events(tenant_a, "retention.evicted")
    assert event.payload["count"] == 2 and set(event.payload["experiences"]) == {
        rows[1].public_id,
        rows[2].public_id,
    }
    assert experiences_evict(tenant=tenant_a) == 0


@pytest.fixture
def endpoint(settings):
    from tests.memory.services.experience_servers import FakeOpenAI

    server = FakeOpenAI()
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, embedder="openai", embedding_url=server.url)
    yield server
    server.close()


def test_reembed_moves_every_row_to_the_new_model(tenant_a, settings):
    from django.core.management import call_command

    rows = [create(tenant_a), create(tenant_a, problem="Nginx returns 502", solution="bind to 0.0.0.0")]
    embed(*rows)
    from tests.memory.services.experience_servers import FakeOpenAI

    server = FakeOpenAI()
    settings.CTXAPP = dataclasses.replace(settings.CTXAPP, embedder="openai", embedding_url=server.url)
    try:
        call_command("reembed")
    finally:
        server.close()
    for row in Experience.objects.filter(pk__in=[r.pk for r in rows]):
        assert (row.embedding_model, row.embedding_status, row.embedding_attempts) == (
            "openai:text-embedding-3-small", "completed", 2,
        )  # fmt: skip


def test_reembed_failed_reports_failure_then_recovers(tenant_a, endpoint):
    from django.core.management import CommandError, call_command

    row = create(tenant_a)
    experiences_mark_failed(experience_ids=[row.pk], reason="first failure")
    endpoint.mode = "fail"
    with pytest.raises(CommandError, match="1 experiences failed"):
        call_command("reembed", "--failed")
    row.refresh_from_db()
    assert row.embedding_status == "failed" and "HTTP 500" in row.embedding_error
    endpoint.mode = "ok"
    call_command("reembed", "--failed")
    row.refresh_from_db()
    assert row.embedding_status == "completed" and row.embedding_error == ""


def test_stale_pending_rows_are_requeued(tenant_a, django_capture_on_commit_callbacks):
    from memory.models import JobIntent
    from memory.services.experiences import experiences_requeue_stale

    with django_capture_on_commit_callbacks(execute=False):
        row = create(tenant_a)  # its own job intent is written here
    Experience.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert experiences_requeue_stale() == 0  # its intent still holds it: not lost
    JobIntent.objects.all().delete()  # a row whose job is really gone (written before the outbox)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert experiences_requeue_stale() == 1
    assert JobIntent.objects.get().payload == {"ids": [row.pk]}
    assert callbacks  # dispatched after commit


def test_a_plain_celery_embed_message_goes_through_the_outbox(tenant_a, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):
        row = create(tenant_a)
    JobIntent.objects.all().delete()  # queued by an older release as a plain Celery message
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert experiences_embed_task.apply(args=[[row.pk]]).get() == 1
    [intent] = JobIntent.objects.all()
    assert intent.kind == jobs.EMBED and intent.payload == {"ids": [row.pk]} and callbacks
    assert jobs.job_run(intent_id=intent.pk) == "done"  # retries and failures: the outbox's
    row.refresh_from_db()
    assert row.embedding_status == "completed"


def test_the_beat_job_evicts_every_tenant_over_capacity(tenant_a, tenant_b):
    from memory.tasks.experiences import experiences_evict_task

    for tenant in (tenant_a, tenant_b):
        ExperiencePolicy.objects.update_or_create(tenant=tenant, defaults={"capacity": 1})
        create(tenant, problem="first problem", solution="one")
        create(tenant, problem="second problem", solution="two")
    assert experiences_evict_task() == 2
    assert (
        Experience.objects.filter(tenant=tenant_a).count()
        == Experience.objects.filter(tenant=tenant_b).count()
        == 1
    )


def test_reembed_reports_progress_per_tenant(tenant_a, tenant_b, monkeypatch):
    from memory.services import experiences as service
    from memory.services.experiences import reembed

    monkeypatch.setattr(reembed, "REEMBED_PROGRESS_EVERY_SECONDS", 0.0)  # where experiences_reembed reads it
    for n in range(5):
        create(tenant_a, problem=f"Pod {n} crash-loops on start")
    for n in range(2):
        create(tenant_b, problem=f"Queue {n} backs up at night")
    batches = []

    result = service.experiences_reembed(batch_size=2, on_batch=batches.append)

    assert (result.total, result.completed, result.failed) == (7, 7, 0)
    assert batches == [2, 2, 2, 1]

    def progress(tenant):
        events = Event.objects.filter(tenant=tenant, type="experience.reembed.progress").order_by("id")
        return [(e.payload["job"], e.payload["done"], e.payload["total"]) for e in events]

    # Each tenant sees only its own share of the job: a start, each batch it had rows in, the end.
    assert progress(tenant_a) == [(result.job, done, 5) for done in (0, 2, 4, 5)]
    assert progress(tenant_b) == [(result.job, done, 2) for done in (0, 1, 2)]
    assert set(Experience.objects.values_list("embedding_status", flat=True)) == {"completed"}
