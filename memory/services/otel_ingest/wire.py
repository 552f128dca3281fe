"""The OTLP/HTTP wire: the export body decompressed and decoded, the response encoded, and the
errors a sender can act on. Pure."""

from __future__ import annotations

import base64
import contextlib
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from memory.exceptions import DomainError, PayloadTooLarge


class OtlpUnsupportedMediaType(DomainError):
    code, http_status = "unsupported_media_type", 415
    default_message = "Send OTLP as application/x-protobuf or application/json."


class OtlpMalformed(DomainError):
    code, http_status = "otlp_malformed", 400
    default_message = "The body is not an OTLP ExportTraceServiceRequest."


@dataclass
class DecodedTraces:
    """A decoded export: the spans that decode, and why each span that does not was left out."""

    request: ExportTraceServiceRequest
    rejected: list[str] = field(default_factory=list)


@dataclass
class IngestResult:
    """What a batch did: spans recorded, already recorded (skipped), rejected (with reasons)."""

    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    held: int = 0  # held until their trace names its agent and conversation (holding.py)
    errors: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)

    def reject(self, reason: str) -> None:
        self.rejected += 1
        if len(self.errors) < 20:
            self.errors.append(reason)


# --- decoding ---------------------------------------------------------------------------------


def _hex_ids_to_base64(value: Any) -> Any:
    """OTLP/JSON writes trace and span ids as hex, where proto3's JSON mapping expects base64."""
    if isinstance(value, list):
        return [_hex_ids_to_base64(item) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        if key in {"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"} and (
            isinstance(item, str)
        ):
            # not hex: left for json_format to refuse (or a base64 sender to pass)
            with contextlib.suppress(ValueError):
                item = base64.b64encode(bytes.fromhex(item)).decode()
        out[key] = _hex_ids_to_base64(item)
    return out


JSON_ERRORS = (ValueError, json_format.ParseError, TypeError, AttributeError, RecursionError)


def _items(value: Any, *keys: str) -> list[Any]:
    """The list under the first of `keys` (OTLP/JSON is lowerCamelCase, proto names are accepted)."""
    if not isinstance(value, dict):
        return []
    for key in keys:
        if isinstance(value.get(key), list):
            return [item for item in value[key] if isinstance(item, dict)]
    return []


def _bad_spans_drop(data: Any) -> list[str]:
    """Take out of an OTLP/JSON body (in place) each span that does not decode on its own, so that
    one bad span does not fail the batch; returns why each was left out."""
    reasons: list[str] = []
    for resource_spans in _items(data, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            spans = scope_spans.get("spans")
            if not isinstance(spans, list):
                continue
            kept = []
            for raw in spans:
                try:
                    json_format.ParseDict(_hex_ids_to_base64(raw), Span(), ignore_unknown_fields=True)
                except JSON_ERRORS as exc:
                    span_id = raw.get("spanId") if isinstance(raw, dict) else None
                    reasons.append(f"span {str(span_id or '?')[:40]}: not an OTLP span: {str(exc)[:200]}")
                    continue
                kept.append(raw)
            scope_spans["spans"] = kept
    return reasons


def traces_request_decode(*, body: bytes, content_type: str) -> DecodedTraces:
    """Decode an OTLP/HTTP export body (already decompressed). Pure.

    In OTLP/JSON a span that does not decode (an id that is neither hex nor base64, a bad value)
    is left out and named in `rejected`; the others are decoded. Raises OtlpUnsupportedMediaType
    (415) for another content type and OtlpMalformed (400) for a body that does not decode.
    """
    media = content_type.split(";")[0].strip().lower()
    request = ExportTraceServiceRequest()
    if media == "application/x-protobuf":
        try:
            request.ParseFromString(body)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise OtlpMalformed(
                f"The body is not an OTLP ExportTraceServiceRequest (protobuf): {exc}."
            ) from None
        return DecodedTraces(request=request)
    if media == "application/json":
        try:
            data = json.loads(body)
            rejected = _bad_spans_drop(data)  # before the ids are rewritten: reasons name them as sent
            json_format.ParseDict(_hex_ids_to_base64(data), request, ignore_unknown_fields=True)
        except JSON_ERRORS as exc:
            raise OtlpMalformed(f"The body is not an OTLP ExportTraceServiceRequest (JSON): {exc}.") from None
        return DecodedTraces(request=request, rejected=rejected)
    raise OtlpUnsupportedMediaType(
        f"Content-Type {media or '(none)'} is not OTLP: send application/x-protobuf or application/json.",
        details={"content_type": media},
    )


def traces_response_encode(*, result: IngestResult, content_type: str) -> bytes:
    """The OTLP ExportTraceServiceResponse for `result`, in the request's encoding. Pure."""
    response = ExportTraceServiceResponse()
    if result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = "; ".join(result.errors)[:2000]
    if content_type.split(";")[0].strip().lower() == "application/x-protobuf":
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


def traces_body_decompress(*, body: bytes, encoding: str) -> bytes:
    """The body without its Content-Encoding (gzip/deflate/identity), bounded by
    CTXAPP_MAX_BODY_BYTES after decompression. Raises PayloadTooLarge, OtlpMalformed,
    OtlpUnsupportedMediaType (an unknown encoding). Pure."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in {"", "identity"}:
        return body
    if encoding not in {"gzip", "deflate"}:
        raise OtlpUnsupportedMediaType(
            f"Content-Encoding {encoding} is not supported: use gzip or none.", details={"encoding": encoding}
        )
    limit = settings.CTXAPP.max_body_bytes
    decompressor = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
    try:
        data = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise OtlpMalformed(f"The body is not valid {encoding} data: {exc}.") from None
    if len(data) > limit or decompressor.unconsumed_tail:
        raise PayloadTooLarge(
            f"The decompressed body is over the limit of {limit} bytes; send smaller batches.",
            details={"limit_bytes": limit},
        )
    return data
