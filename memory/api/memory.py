"""Memory search API.

Routes (under /api/v1):
    POST /memory/search      messages, summaries, facts and experiences of a scope, ranked for a query
    GET  /memory/index       the tenant's messages per embedding status (is indexing done?)
"""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_serializer
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.agent_scope import bound_agent
from memory.api.base import ID_MAX_LENGTH, SESSION_ID_MAX_LENGTH, BodySerializer, TenantApiView
from memory.api.shapes import IsoDateTimeField
from memory.services import memory_search, message_indexing, ranking
from memory.services.agent_access import names_check


# An inline enum in the OpenAPI document (a ChoiceField's would be a second component for the
# choices a hit's `kind` already names, which drf-spectacular warns about).
@extend_schema_field({"type": "string", "enum": list(memory_search.KINDS)})
class KindField(serializers.ChoiceField):
    """One of the kinds memory search knows; an unknown one is refused listing them all."""

    def __init__(self, **kwargs: Any) -> None:
        known = ", ".join(memory_search.KINDS)
        refusal = f'Unknown kind "{{input}}"; kinds are {known}.'
        super().__init__(choices=memory_search.KINDS, error_messages={"invalid_choice": refusal}, **kwargs)


class ScopeSerializer(BodySerializer):
    agent = serializers.CharField(
        required=False, max_length=ID_MAX_LENGTH, help_text="Only this agent's sessions (404 if unknown)."
    )
    user_id = serializers.CharField(
        required=False, allow_blank=True, max_length=ID_MAX_LENGTH, help_text="Only this user's sessions."
    )
    session = serializers.CharField(
        required=False, max_length=SESSION_ID_MAX_LENGTH, help_text="A session id (404 if unknown)."
    )
    sessions = serializers.ChoiceField(
        choices=memory_search.SESSIONS_CHOICES,
        default="all",
        help_text="`current`: only `session`; `all`: every session of its user (or agent), or of the scope.",
    )


class TimeRangeSerializer(BodySerializer):
    # `from` is a Python keyword: declared below.
    to = serializers.DateTimeField(required=False, help_text="Occurred at or before (inclusive).")


TimeRangeSerializer._declared_fields["from"] = serializers.DateTimeField(
    required=False, help_text="Occurred at or after (inclusive)."
)


class NeighbourSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    role = serializers.CharField()
    speaker = serializers.CharField(source="name")
    text = serializers.CharField(source="content")
    occurred_at = IsoDateTimeField(allow_null=True)


class RoundedFloatField(serializers.FloatField):
    """A float rounded to `places` in the answer (the service keeps full precision for thresholds)."""

    def __init__(self, *, places: int, **kwargs: Any) -> None:
        self.places = places
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return round(float(value), self.places)


class HitSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=memory_search.KINDS)
    id = serializers.CharField(help_text="Messages: `<session id>:<seq>`; others: their public id.")
    session = serializers.CharField(allow_null=True)
    seq = serializers.IntegerField(allow_null=True)
    occurred_at = IsoDateTimeField(allow_null=True)
    speaker = serializers.CharField()
    text = serializers.CharField()
    score = serializers.FloatField()
    similarity = RoundedFloatField(
        places=4, allow_null=True, help_text="Raw cosine to the query (null: no vector)."
    )
    contributions = serializers.DictField(
        child=serializers.FloatField(),
        help_text="Each signal's share: dense, lexical, speaker, date, neighbour, recency, length.",
    )
    neighbours = NeighbourSerializer(
        many=True, required=False, help_text="Only when asked (`neighbours` > 0)."
    )
    sources = serializers.ListField(
        child=serializers.DictField(), required=False,
        help_text="User memories only: the turns ({session, seq}) the memory was taken from.",
    )  # fmt: skip

    def to_representation(self, instance: memory_search.SearchHit) -> dict[str, Any]:
        data = super().to_representation(instance)
        if instance.neighbours is None:
            del data["neighbours"]  # not asked for
        if instance.sources is None:
            del data["sources"]  # not a user memory
        return data


PlanSerializer = cast(
    type[serializers.Serializer],
    type(
        "PlanSerializer",
        (serializers.Serializer,),
        {
            f.name: {
                "int": serializers.IntegerField,
                "str": serializers.CharField,
                "bool": serializers.BooleanField,
            }.get(str(f.type), serializers.FloatField)()
            for f in dataclasses.fields(ranking.Plan)
        },
    ),
)


class SearchOutputSerializer(serializers.Serializer):
    query = serializers.CharField()
    results = HitSerializer(many=True)
    plan = PlanSerializer(help_text="The ranking plan used (memory/services/ranking.py).")
    warnings = serializers.ListField(child=serializers.CharField())
    candidates = serializers.IntegerField(help_text="Candidates ranked before the cut to `limit`.")


_PLAN_TYPES = {
    f.name: {"int": int, "str": str, "bool": bool}.get(str(f.type), float)
    for f in dataclasses.fields(ranking.Plan)
}


def search_result_out(result: memory_search.SearchResult) -> dict[str, Any]:
    """A memory search's answer, as POST /memory/search and the MCP server give it: the shape
    SearchOutputSerializer documents, built directly (constructing the serializers cost a search
    more CPU than ranking it); tests/memory/api/test_memory_search.py compares the two."""
    plan = {name: kind(getattr(result.plan, name)) for name, kind in _PLAN_TYPES.items()}
    return {
        "query": result.query,
        "results": [_hit_out(hit) for hit in result.results],
        "plan": plan,
        "warnings": [str(w) for w in result.warnings],
        "candidates": int(result.candidates),
    }


def _hit_out(hit: memory_search.SearchHit) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": hit.kind,
        "id": str(hit.id),
        "session": None if hit.session is None else str(hit.session),
        "seq": None if hit.seq is None else int(hit.seq),
        "occurred_at": None if hit.occurred_at is None else str(hit.occurred_at.isoformat()),
        "speaker": str(hit.speaker),
        "text": str(hit.text),
        "score": float(hit.score),
        "similarity": None if hit.similarity is None else round(float(hit.similarity), 4),
        "contributions": {str(k): float(v) for k, v in hit.contributions.items()},
    }
    if hit.neighbours is not None:
        out["neighbours"] = [
            {
                "seq": int(m.seq), "role": str(m.role), "speaker": str(m.name), "text": str(m.content),
                "occurred_at": None if m.occurred_at is None else str(m.occurred_at.isoformat()),
            }
            for m in hit.neighbours
        ]  # fmt: skip
    if hit.sources is not None:
        out["sources"] = [dict(source) for source in hit.sources]
    return out


class IndexStatusSerializer(serializers.Serializer):
    pending = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()
    skipped = serializers.IntegerField()


class MemorySearchApi(TenantApiView):
    required_scope = "read"  # a POST that only reads

    @extend_schema_serializer(component_name="MemorySearchInput")
    class InputSerializer(BodySerializer):
        query = serializers.CharField(max_length=4000, help_text="What to look for (non-empty).")
        scope = ScopeSerializer(required=False)
        kinds = serializers.ListField(
            child=KindField(),
            required=False, allow_empty=False, max_length=len(memory_search.KINDS),
            help_text="Any of message, summary, fact, experience, user_memory (default: all).",
        )  # fmt: skip
        limit = serializers.IntegerField(
            required=False, default=10, min_value=1, max_value=memory_search.MAX_LIMIT
        )
        time_range = TimeRangeSerializer(required=False)
        plan = serializers.DictField(
            required=False, help_text="Ranking plan fields (ranking.Plan); unknown → 422."
        )
        neighbours = serializers.IntegerField(
            required=False, default=0, min_value=0, max_value=memory_search.MAX_NEIGHBOURS,
            help_text="Include this many turns either side of each message hit.",
        )  # fmt: skip
        min_similarity = serializers.FloatField(
            required=False, min_value=-1.0, max_value=1.0,
            help_text="Relevance floor: an item sharing no word with the query needs this cosine "
            "to it to be listed (default: the tenant's memory policy, 0.15).",
        )  # fmt: skip
        as_of = serializers.DateTimeField(
            required=False,
            help_text="User memories as they were at this moment (default: the current ones).",
        )

    @extend_schema(
        request=InputSerializer,
        responses=SearchOutputSerializer,
        summary="Search conversational memory (messages, summaries, facts, experiences)",
        description="Hybrid ranking (BM25 + embedding cosine, z-score fusion, neighbour smoothing). "
        "Empty query, unknown kind or plan field, limit outside 1..100 → 422 naming the field; "
        "an unknown or another tenant's session or agent in the scope → 404.",
    )
    def post(self, request: Any) -> Response:
        data = self.validate(self.InputSerializer)
        scope = dict(data.get("scope") or {})
        bound = bound_agent(self)
        if bound:
            # A key bound to an agent searches only what it may read (agent_access.rows_visible):
            # another agent, or another agent's session (even as the "current" one), in the scope
            # is refused.
            names_check(
                tenant=self.tenant,
                bound_agent=bound,
                agents=[scope.get("agent") or ""],
                session_ids=[scope.get("session") or ""],
            )
        time_range = data.get("time_range") or {}
        result = memory_search.memory_search(
            tenant=self.tenant,
            query=data["query"],
            scope=memory_search.SearchScope(
                agent=scope.get("agent") or None,
                user_id=scope.get("user_id"),
                session=scope.get("session") or None,
                sessions=scope.get("sessions", "all"),
                bound_agent=bound,
            ),
            kinds=data.get("kinds"),
            limit=data["limit"],
            time_from=time_range.get("from"),
            time_to=time_range.get("to"),
            plan=memory_search.plan_parse(data["plan"]) if "plan" in data else None,
            neighbours=data["neighbours"],
            min_similarity=data.get("min_similarity"),
            as_of=data.get("as_of"),
        )
        return Response(search_result_out(result))


class MemoryIndexStatusApi(TenantApiView):
    @extend_schema(
        responses=IndexStatusSerializer,
        summary="The tenant's messages per embedding status (pending, completed, failed, skipped)",
    )
    def get(self, request: Any) -> Response:
        return Response(message_indexing.memory_index_status(tenant=self.tenant))


urlpatterns = [
    path("memory/search", MemorySearchApi.as_view(), name="memory-search"),
    path("memory/index", MemoryIndexStatusApi.as_view(), name="memory-index"),
]
