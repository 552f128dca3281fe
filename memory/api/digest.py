"""Session digests (medium-term memory): the latest, one version, the list of versions; refresh.

GET  /api/v1/sessions/{id}/digest            the latest version (?version=N: that one)
POST /api/v1/sessions/{id}/digest            queue an update now (202)
GET  /api/v1/sessions/{id}/digests           every version, newest first (cursor pages)
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from memory.api.base import CursorSerializer, TenantApiView, keyset_page
from memory.models import SessionDigest
from memory.services import session_digest as svc
from memory.services.sessions import session_access


class DigestItemSerializer(serializers.Serializer):
    class Meta:
        ref_name = "DigestItem"

    text = serializers.CharField()
    seq = serializers.IntegerField(allow_null=True, help_text="The message it came from (null: LLM-written).")


class DigestSerializer(serializers.Serializer):
    class Meta:
        ref_name = "SessionDigest"

    session = serializers.CharField(source="session.public_id")
    user_id = serializers.CharField()
    version = serializers.IntegerField()
    method = serializers.CharField(help_text="offline | llm | llm_fallback")
    error = serializers.CharField(help_text="Why the LLM was not used (llm_fallback); else empty.")
    covers_up_to_seq = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    text = serializers.CharField(help_text="The digest as text (what a prompt and search see).")
    goals = DigestItemSerializer(many=True, source="content.goals", default=list)
    decisions = DigestItemSerializer(many=True, source="content.decisions", default=list)
    findings = DigestItemSerializer(many=True, source="content.findings", default=list)
    preferences = DigestItemSerializer(many=True, source="content.preferences", default=list)
    constraints = DigestItemSerializer(many=True, source="content.constraints", default=list)
    progress = DigestItemSerializer(many=True, source="content.progress", default=list)
    open_questions = DigestItemSerializer(many=True, source="content.open_questions", default=list)


def digest_out(digest: SessionDigest) -> dict[str, Any]:
    """A digest as every endpoint answers it (a category the content lacks is an empty list)."""
    return dict(DigestSerializer(digest).data)


class SessionDigestApi(TenantApiView):
    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "SessionDigestQuery"

        version = serializers.IntegerField(
            min_value=1, max_value=2_147_483_647, required=False, help_text="That version, not the latest."
        )

    @extend_schema(
        parameters=[QuerySerializer],
        responses=DigestSerializer,
        summary="The session's digest: goals, decisions, findings, preferences, constraints, progress, "
        "open questions (latest, or ?version=)",
    )
    def get(self, request: Request, session_id: str) -> Response:
        data = self.validate_query(self.QuerySerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        digest = svc.session_digest_get(tenant=self.tenant, session=session, version=data.get("version"))
        return Response(digest_out(digest))

    @extend_schema(
        request=None,
        responses={202: inline_serializer("SessionDigestQueued", {"queued": serializers.BooleanField()})},
        summary="Queue an update of the session's digest now",
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = session_access(tenant=self.tenant, session_id=session_id)
        svc.session_digest_queue(session=session)
        return Response({"queued": True, "session": session.public_id}, status=status.HTTP_202_ACCEPTED)


class SessionDigestListApi(TenantApiView):
    schema_is_list = True

    class PageSerializer(serializers.Serializer):
        class Meta:
            ref_name = "SessionDigestPage"

        items = DigestSerializer(many=True)
        next = serializers.CharField(allow_null=True, help_text="Pass as `cursor` for the next page.")
        results = DigestSerializer(many=True, help_text="Deprecated: the same list as `items`.")
        next_cursor = serializers.CharField(allow_null=True, help_text="Deprecated: `next`.")

    @extend_schema(
        parameters=[CursorSerializer], responses=PageSerializer, summary="The session's digest versions"
    )
    def get(self, request: Request, session_id: str) -> Response:
        page = self.validate_query(CursorSerializer)
        session = session_access(tenant=self.tenant, session_id=session_id)
        rows, next_cursor = keyset_page(
            svc.session_digests_list(tenant=self.tenant, session=session).select_related("session"),
            cursor=page.get("cursor"),
            limit=page.get("limit"),
        )
        items = [digest_out(d) for d in rows]
        return Response({"items": items, "next": next_cursor, "results": items, "next_cursor": next_cursor})


urlpatterns = [
    path("sessions/<str:session_id>/digest", SessionDigestApi.as_view(), name="api-session-digest"),
    path("sessions/<str:session_id>/digests", SessionDigestListApi.as_view(), name="api-session-digests"),
]
