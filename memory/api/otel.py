"""POST /v1/traces: OTLP/HTTP trace export (protobuf or JSON), outside /api/v1 where exporters look."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.parsers import BaseParser
from rest_framework.request import Request

from memory.api.base import TenantApiView
from memory.services import otel_ingest


class _RawBodyParser(BaseParser):
    """Leaves the body to the view: OTLP is decoded by opentelemetry-proto, not by DRF."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return None


class OtlpTracesApi(TenantApiView):
    parser_classes = [_RawBodyParser]

    def idempotent(self, request: Request, key: str, run: Callable[[], Any]) -> Any:
        # Span ids already make an export idempotent, and the OTLP response is protobuf or JSON
        # bytes, not data to store: an Idempotency-Key header is accepted and not needed.
        return run()

    @extend_schema(
        summary="OTLP/HTTP trace export (GenAI semantic conventions)",
        description=(
            "Body: an OTLP ExportTraceServiceRequest as application/x-protobuf or application/json, "
            "optionally gzip-encoded. Spans become sessions, messages, usage reports and events "
            "(docs/integrations.md). Idempotent per span. Spans that cannot be recorded are "
            "reported in partialSuccess (rejectedSpans, errorMessage), never as a 5xx."
        ),
        request={"application/x-protobuf": bytes, "application/json": dict},
        responses={200: OpenApiResponse(description="ExportTraceServiceResponse, in the request's encoding")},
        tags=["otel"],
    )
    def post(self, request: Request) -> HttpResponse:
        content_type = request.content_type or ""
        body = otel_ingest.traces_body_decompress(
            body=request._request.body, encoding=request.headers.get("Content-Encoding", "")
        )
        decoded = otel_ingest.traces_request_decode(body=body, content_type=content_type)
        bound = self.request.auth.agent_external_id  # type: ignore[union-attr]
        result = otel_ingest.traces_ingest(
            tenant=self.tenant, request=decoded.request, bound_agent=bound or "", rejected=decoded.rejected
        )
        media = content_type.split(";")[0].strip().lower()
        encoded = otel_ingest.traces_response_encode(result=result, content_type=media)
        return HttpResponse(encoded, content_type=media, status=200)


urlpatterns = [path("v1/traces", OtlpTracesApi.as_view(), name="otlp-traces")]
