"""The framework floor: the cheapest requests a Django + DRF service behind ctxapp's edge can serve.

The URLs of `bench/bench_peers.py --only floor` and `bench/bench_cost.py` only (never in production
URLs): ctxapp's URLs, plus `GET /bench/floor` (authentication, permission and throttles, then an
answer naming the key's tenant: no database) and `POST /bench/floor/<session pk>`, a bare DRF
`APIView` with the same middleware,
authentication (API key), permission and throttles (the REST_FRAMEWORK defaults every ctxapp view
has), whose handler is one ORM `create()` of a message row: no seq counter, no event, no token
count, no idempotency, no broadcast. ctxapp's REST append ÷ this is what ctxapp adds on top of
what any Django service pays.

    DJANGO_SETTINGS_MODULE=bench.floor_settings (which mounts this module)
"""

from __future__ import annotations

import uuid
from typing import Any

from django.urls import include, path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memory.api import throttles
from memory.models import Message, MessageEmbeddingStatus


class FloorApi(APIView):
    """Nothing behind the API's edge: what an authenticated GET costs before any work."""

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # As ctxapp's API views: the failed-authentication check rides on the rate-limit count.
        throttles.auth_failures_defer(request)
        super().initial(request, *args, **kwargs)

    def get(self, request: Request) -> Response:
        return Response({"tenant": request.auth.tenant_id})  # type: ignore[union-attr]


class FloorAppendApi(FloorApi):
    """One INSERT behind the API's edge."""

    def post(self, request: Request, session_pk: int) -> Response:
        body: dict[str, Any] = request.data  # type: ignore[assignment]  # a JSON object
        message = Message.objects.create(
            tenant_id=request.auth.tenant_id,  # type: ignore[union-attr]
            session_id=session_pk,
            seq=uuid.uuid4().int >> 66,  # unique without a counter: the floor has none
            role=str(body["role"]),
            content=str(body["content"]),
            # Nothing embeds it (no drain is sent): a pending row would wait for the index sweep.
            embedding_status=MessageEmbeddingStatus.SKIPPED,
        )
        return Response({"seq": message.seq}, status=201)


urlpatterns = [
    path("bench/floor", FloorApi.as_view()),
    path("bench/floor/<int:session_pk>", FloorAppendApi.as_view()),
    path("", include("ctxapp.urls")),
]
