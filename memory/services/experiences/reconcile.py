"""Merge and supersede: what happens between two experiences, by hand or once embedded.

Only near-identical texts merge (cosine AND word overlap, `merge_allowed`); a newer experience
with the same problem but a different solution supersedes the older one. Both keep every row.
"""

from __future__ import annotations

import re

import numpy as np
from django.db import connection
from django.utils import timezone
from pgvector.django import CosineDistance

from memory.exceptions import NotFound
from memory.models import EmbeddingStatus, Experience, ExperienceKind, ExperiencePolicy, Tenant
from memory.services import recorder
from memory.services.embedding import text_hash, vector_text, vectors_cached
from memory.services.experiences.records import boosted_confidence, event_payload

# A neighbour less similar than this is not even considered for merge / supersede.
RECONCILE_CANDIDATE_FLOOR = 0.55
_FLOAT_MARGIN = 1e-4  # float32 (numpy) vs pgvector cosine rounding: err toward reconciling
_WORD = re.compile(r"\w+")


def experience_merge(*, tenant: Tenant, duplicate: Experience, into: Experience, similarity: float) -> None:
    """Fold `duplicate` into the older `into`: confidence and use count up, provenance kept.

    `duplicate`'s text joins `into.aliases` (searchable by full text); `duplicate` stays, hidden,
    with merged_into. Call inside a transaction. Records experience.merged.
    """
    now = timezone.now()
    into.confidence = boosted_confidence(into.confidence, duplicate.confidence)
    into.use_count += 1 + duplicate.use_count
    into.merge_count += 1
    into.helpful_count += duplicate.helpful_count
    into.unhelpful_count += duplicate.unhelpful_count
    into.provenance = [
        *into.provenance,
        *({**p, "merged_from": duplicate.public_id} for p in duplicate.provenance),
    ]
    # The duplicate's own wording (and what was merged into it) stays findable by full text.
    # One alias per line (the text on one line).
    current = [line for line in into.aliases.splitlines() if line]
    known = {*current, " ".join(into.text.split())}
    incoming = [" ".join(duplicate.text.split()), *duplicate.aliases.splitlines()]
    added = [t for t in dict.fromkeys(incoming) if t and t not in known]
    into.aliases = "\n".join([*current, *added])
    into.updated_at = now
    into.save(
        update_fields=[
            "confidence", "use_count", "merge_count", "helpful_count", "unhelpful_count", "provenance",
            "aliases", "updated_at",
        ]
    )  # fmt: skip
    duplicate.merged_into = into
    duplicate.merged_at = now
    duplicate.updated_at = now
    duplicate.save(update_fields=["merged_into", "merged_at", "updated_at"])
    recorder.event_append(
        tenant=tenant,
        type="experience.merged",
        session=duplicate.source_session,
        payload=event_payload(into, merged=duplicate.public_id, similarity=round(similarity, 4)),
    )


def experience_supersede(
    *, tenant: Tenant, older: Experience, newer: Experience, reason: str, **scores: float
) -> None:
    """Hide `older` behind `newer` (kept, linked). Call inside a transaction.

    Records experience.superseded.
    """
    if older.tenant_id != tenant.pk or newer.tenant_id != tenant.pk:
        raise NotFound.of("experience", older.public_id)
    now = timezone.now()
    older.superseded_by = newer
    older.superseded_at = now
    older.updated_at = now
    older.save(update_fields=["superseded_by", "superseded_at", "updated_at"])
    recorder.event_append(
        tenant=tenant,
        type="experience.superseded",
        session=newer.source_session,
        payload=event_payload(
            older, superseded_by=newer.public_id, reason=reason, **{k: round(v, 4) for k, v in scores.items()}
        ),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def token_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' lower-cased word sets (1.0 = the same words)."""
    left, right = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
    if not left and not right:
        return 1.0
    return len(left & right) / len(left | right)


def merge_allowed(
    *, duplicate: Experience, into: Experience, similarity: float, policy: ExperiencePolicy
) -> bool:
    """Whether `duplicate` may merge into `into`: near-identical only (cosine AND word overlap).

    A paraphrase scores a high cosine (0.9+) yet says something in other words that a reader
    may search for; only a cosine >= policy.merge_threshold (0.97) with a word-set overlap >=
    policy.merge_token_overlap (0.8) counts as the same text. A row created with merge=False
    never merges into another.
    """
    if not duplicate.mergeable:
        return False
    if similarity < policy.merge_threshold:
        return False
    return token_overlap(duplicate.text, into.text) >= policy.merge_token_overlap


def _nearest_neighbour(experience: Experience, exclude: list[int] | None = None) -> Experience | None:
    """The closest other completed, visible experience of the same kind, scope, user and agent
    (none of `exclude`: the rows of the same embedding batch not reconciled yet)."""
    neighbour_query = (
        Experience.objects.filter(
            tenant_id=experience.tenant_id,
            kind=experience.kind,
            scope=experience.scope,
            user_id=experience.user_id,
            agent=experience.agent,
            embedding_status=EmbeddingStatus.COMPLETED,
            merged_into__isnull=True,
            superseded_by__isnull=True,
        )
        .exclude(pk=experience.pk)
        .exclude(pk__in=exclude or [])
        .annotate(distance=CosineDistance("embedding", experience.embedding))
        .order_by("distance")
        .select_related("source_session")
        .defer("embedding", "problem_embedding", "search_vector")
    )
    if experience.problem_embedding is not None:
        neighbour_query = neighbour_query.annotate(
            problem_distance=CosineDistance("problem_embedding", experience.problem_embedding)
        )
    return neighbour_query.first()


def _supersede_if_contradicting(
    *, experience: Experience, neighbour: Experience, similarity: float, policy: ExperiencePolicy
) -> bool:
    """Same problem, different solution: the older of the two is superseded. Whether it was."""
    problem_distance = getattr(neighbour, "problem_distance", None)
    # Problems are compared on the stored problem vectors; only a pair about the same problem
    # pays for embedding its two solutions (cached by text).
    problem_similarity = 1.0 - float(problem_distance) if problem_distance is not None else similarity
    if not (
        experience.solution
        and neighbour.solution
        and problem_similarity >= policy.supersede_problem_threshold
    ):
        return False
    texts = [experience.solution, neighbour.solution]
    tenant = experience.tenant_id
    _, by_key = vectors_cached({(tenant, text_hash(t)): t for t in texts})
    solution_similarity = _cosine(
        by_key[(tenant, text_hash(texts[0]))], by_key[(tenant, text_hash(texts[1]))]
    )
    if solution_similarity >= policy.solution_agreement_threshold:
        return False
    older, newer = (
        (neighbour, experience) if neighbour.created_at <= experience.created_at else (experience, neighbour)
    )
    experience_supersede(
        tenant=experience.tenant,
        older=older,
        newer=newer,
        reason="contradiction",
        problem_similarity=problem_similarity,
        solution_similarity=solution_similarity,
    )
    return True


def reconcile(
    *, experience: Experience, policy: ExperiencePolicy, exclude: list[int] | None = None
) -> str | None:
    """After `experience` got its vector: merge it into, or let it supersede, its nearest neighbour
    (never one of `exclude`)."""
    if experience.kind != ExperienceKind.EXPERIENCE or experience.embedding is None:
        return None
    neighbour = _nearest_neighbour(experience, exclude)
    if neighbour is None:
        return None
    similarity = 1.0 - float(neighbour.distance)  # type: ignore[attr-defined]
    if similarity < RECONCILE_CANDIDATE_FLOOR:
        return None
    if _supersede_if_contradicting(
        experience=experience, neighbour=neighbour, similarity=similarity, policy=policy
    ):
        return "superseded"
    duplicate, into = (
        (experience, neighbour) if neighbour.created_at <= experience.created_at else (neighbour, experience)
    )
    if merge_allowed(duplicate=duplicate, into=into, similarity=similarity, policy=policy):
        experience_merge(tenant=experience.tenant, duplicate=duplicate, into=into, similarity=similarity)
        return "merged"
    return None


def nearest_similarities(rows: list[Experience]) -> list[float]:
    """For each of `rows` (just embedded, in order): the cosine similarity of the closest
    candidate `reconcile` could see — a stored completed, visible experience of the same kind,
    scope, user and agent (one query for all rows), or an earlier row of `rows` of the same
    (computed here). -1.0 for a row `reconcile` skips. An upper bound: it may count a candidate
    that reconcile would not (an earlier row hidden meanwhile), never miss one, so a row below
    RECONCILE_CANDIDATE_FLOOR may safely skip reconcile. Small margin for float rounding."""
    closest = [-1.0] * len(rows)
    eligible = [
        i for i, r in enumerate(rows) if r.kind == ExperienceKind.EXPERIENCE and r.embedding is not None
    ]
    if not eligible:
        return closest
    table = Experience._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT b.ord, n.sim
            FROM unnest(
                %s::int[], %s::text[]::vector[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[]
            ) AS b(ord, v, tenant, kind, scope, uid, agent)
            CROSS JOIN LATERAL (
                SELECT 1 - (e.embedding <=> b.v) AS sim FROM {table} e
                WHERE e.tenant_id = b.tenant AND e.kind = b.kind AND e.scope = b.scope
                  AND e.user_id = b.uid AND e.agent = b.agent AND e.embedding_status = %s
                  AND e.merged_into_id IS NULL AND e.superseded_by_id IS NULL AND e.id <> ALL(%s::bigint[])
                ORDER BY e.embedding <=> b.v LIMIT 1
            ) n
            """,
            [
                eligible, [vector_text(np.asarray(rows[i].embedding)) for i in eligible],
                [rows[i].tenant_id for i in eligible], [rows[i].kind for i in eligible],
                [rows[i].scope for i in eligible], [rows[i].user_id for i in eligible],
                [rows[i].agent for i in eligible], EmbeddingStatus.COMPLETED, [r.pk for r in rows],
            ],
        )  # fmt: skip
        for position, similarity in cursor.fetchall():
            closest[position] = float(similarity) + _FLOAT_MARGIN
    groups: dict[tuple[int, str, str, str, str], list[int]] = {}
    for i in eligible:
        r = rows[i]
        groups.setdefault((r.tenant_id, r.kind, r.scope, r.user_id, r.agent), []).append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        matrix = np.stack([np.asarray(rows[i].embedding, dtype=np.float32) for i in members])
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        similarity = matrix @ matrix.T
        for k in range(1, len(members)):
            earlier = float(similarity[k, :k].max()) + _FLOAT_MARGIN
            closest[members[k]] = max(closest[members[k]], earlier)
    return closest
