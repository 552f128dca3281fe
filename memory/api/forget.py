"""Forgetting a user and redacting a message (memory/services/forget.py).

`DELETE /users/{user_id}` needs the admin scope. `POST /sessions/{id}/messages/{seq}/redact` needs
write (a read key gets 403): redacting is a correction of one's own conversation, like an append.
A key bound to an agent forgets only that agent's sessions of the user (404 when the user never
had one) and redacts only its own sessions (403 `agent_mismatch`, TenantApiView's binding check).
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response

from memory.api.base import MAX_BIGINT, BodySerializer, TenantApiView
from memory.exceptions import NotFound
from memory.models import ApiKeyScope
from memory.selectors import sessions as selectors
from memory.services import forget

ForgetReceiptSerializer = inline_serializer(
    "ForgetReceipt",
    {
        "user_id": serializers.CharField(),
        "counts": serializers.DictField(
            child=serializers.IntegerField(),
            help_text="Rows erased per kind (sessions, messages, embedding_cache, summaries, digests, "
            "tracked_facts, user_memories, experiences, tasks, checkpoints, cognitive_states, "
            "store_items, events (tombstoned), otel_held_spans, stored_responses, jobs); all zero "
            "when the user was already forgotten.",
        ),
    },
)
RedactReceiptSerializer = inline_serializer(
    "RedactReceipt",
    {
        "session": serializers.CharField(),
        "seq": serializers.IntegerField(),
        "counts": serializers.DictField(
            child=serializers.IntegerField(),
            help_text="What changed per kind (messages, embedding_cache, summaries, digests, "
            "tracked_facts, user_memories, events (tombstoned), context_builds, stored_responses).",
        ),
    },
)


class UserForgetApi(TenantApiView):
    required_scope = ApiKeyScope.ADMIN

    @extend_schema(
        request=None,
        responses={200: ForgetReceiptSerializer},
        summary="Forget a user: erase everything of theirs in the tenant (admin scope)",
        description="Messages and their embeddings, embedding-cache entries, summaries, digests, "
        "tracked facts, user memories, the user's experiences and tasks, and every process's "
        "search caches; events stay as tombstones (type, time, ids). Records `user.forgotten`. "
        "Idempotent: forgetting again answers zero counts. An unknown user → 404.",
    )
    def delete(self, request: Any, user_id: str) -> Response:
        bound = request.auth.agent_external_id
        agent = None
        if bound:
            try:
                agent = selectors.agent_get(tenant=self.tenant, external_id=bound)
            except NotFound:  # an agent with no session yet has no user to forget
                raise NotFound.of("user", user_id) from None
        receipt = forget.forget_user(tenant=self.tenant, user_id=user_id, agent=agent)
        return Response({"user_id": receipt.user_id, "counts": receipt.counts})


class RedactSerializer(BodySerializer):
    class Meta:
        ref_name = "MessageRedact"

    replacement = serializers.CharField(
        required=False,
        default="[redacted]",
        allow_blank=True,
        max_length=10_000,
        trim_whitespace=False,
        help_text="What the message says instead (default `[redacted]`).",
    )


SEQ_PARAM = OpenApiParameter(
    "seq", OpenApiTypes.INT, OpenApiParameter.PATH, description="The message's seq in its session."
)


class MessageRedactApi(TenantApiView):
    required_scope = ApiKeyScope.WRITE

    @extend_schema(
        parameters=[SEQ_PARAM],
        request=RedactSerializer,
        responses=RedactReceiptSerializer,
        summary="Redact one message everywhere it was copied (write scope)",
        description="Its content (and tool-call arguments) become `replacement`; the full-text "
        "index follows; the embedding is computed again; summaries and digest versions covering it "
        "are re-derived; tracked facts and user memories taken from it are deleted; events, context "
        "builds and stored responses quoting it are tombstoned or deleted; every process's search "
        "caches drop it. Records `message.redacted` (no content). An unknown seq → 404.",
    )
    def post(self, request: Any, session_id: str, seq: str) -> Response:
        data = self.validate(RedactSerializer)
        session = selectors.session_get(tenant=self.tenant, session_id=session_id)
        # A str path parameter, so that the agent-binding check answers before any 404 of the seq.
        if not (seq.isascii() and seq.isdigit() and int(seq) <= MAX_BIGINT):
            raise NotFound.of("message", f"{session_id}#{seq}")
        receipt = forget.message_redact(
            tenant=self.tenant, session=session, seq=int(seq), replacement=data["replacement"]
        )
        return Response({"session": receipt.session, "seq": receipt.seq, "counts": receipt.counts})


urlpatterns = [
    path("users/<str:user_id>", UserForgetApi.as_view(), name="api-user-forget"),
    path(
        "sessions/<str:session_id>/messages/<str:seq>/redact",
        MessageRedactApi.as_view(),
        name="api-message-redact",
    ),
]
