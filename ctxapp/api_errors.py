"""Every API error is JSON: {"error": {"code": ..., "message": ..., "details": {...}}}.

This covers DRF's own exceptions, our DomainErrors, Django's 404/500 handlers for /api/ paths,
and the 413 raised before a body is read.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found, server_error
from rest_framework import exceptions as drf
from rest_framework.response import Response
from rest_framework.views import set_rollback

from memory.exceptions import DomainError

logger = logging.getLogger(__name__)

INTERNAL_ERROR_MESSAGE = (
    "Something went wrong on our side and it was logged. Retrying with the same Idempotency-Key is safe."
)

DRF_CODES: dict[type[Exception], tuple[str, str | None]] = {
    drf.ParseError: ("invalid_json", "The request body is not valid JSON."),
    drf.NotAuthenticated: (
        "unauthenticated",
        "Authentication required: send 'Authorization: Bearer <api key>'.",
    ),
    drf.AuthenticationFailed: ("invalid_api_key", None),
    drf.PermissionDenied: ("forbidden", None),
    drf.NotFound: ("not_found", "Not found."),
    drf.MethodNotAllowed: ("method_not_allowed", None),
    drf.NotAcceptable: ("not_acceptable", None),
    drf.UnsupportedMediaType: ("unsupported_media_type", None),
    drf.Throttled: ("rate_limited", None),
}


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def _validation_details(detail: Any) -> dict[str, Any]:
    if isinstance(detail, dict):
        return {"fields": detail}
    return {"fields": {"non_field_errors": detail if isinstance(detail, list) else [detail]}}


def _first_message(detail: Any, prefix: str = "") -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            return _first_message(value, name)
    if isinstance(detail, list) and detail:
        for index, item in enumerate(detail):
            if isinstance(item, dict | list):
                return _first_message(item, f"{prefix}[{index}]")
            return f"{prefix}: {item}" if prefix and prefix != "non_field_errors" else str(item)
    return f"{prefix}: {detail}" if prefix else str(detail)


DATABASE_RETRY_AFTER_SECONDS = 5


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    set_rollback()
    if isinstance(exc, DomainError):
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.http_status)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", "Not found."), status=404)
    if isinstance(exc, PermissionDenied):
        return Response(error_body("forbidden", "You may not do this."), status=403)
    if isinstance(exc, RequestDataTooBig):
        limit = _body_limit()
        return Response(error_body(*_too_large(limit)), status=413)
    if isinstance(exc, drf.ValidationError):
        detail = exc.detail
        return Response(
            error_body("validation_error", _first_message(detail), _validation_details(detail)),
            status=422,
        )
    if isinstance(exc, drf.APIException):
        code, message = DRF_CODES.get(type(exc), (None, None))
        if code is None:
            for klass, (c, m) in DRF_CODES.items():
                if isinstance(exc, klass):
                    code, message = c, m
                    break
        code = code or str(getattr(exc, "default_code", "error"))
        text = message or (
            str(exc.detail) if not isinstance(exc.detail, dict | list) else str(exc.default_detail)
        )
        if isinstance(exc, drf.UnsupportedMediaType):
            text = f"{text} Send the body as JSON, with 'Content-Type: application/json'."
        response = Response(error_body(code, text), status=exc.status_code)
        if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
            response["WWW-Authenticate"] = 'Bearer realm="api"'
        wait = getattr(exc, "wait", None)
        if isinstance(exc, drf.Throttled) and wait:
            response["Retry-After"] = str(int(wait))
        return response
    if isinstance(exc, OperationalError | InterfaceError):
        # The database went away (restart, failover, pool timeout): the transaction was rolled
        # back, so nothing was applied; the client may retry the same request.
        logger.warning("database unavailable in %s: %s", context.get("view"), exc)
        response = Response(
            error_body(
                "database_unavailable",
                "The database is not reachable right now; nothing was applied. Retry shortly.",
            ),
            status=503,
        )
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response
    logger.exception("Unhandled error in %s", context.get("view"))
    return Response(
        error_body(
            "internal_error",
            INTERNAL_ERROR_MESSAGE,
        ),
        status=500,
    )


def _body_limit() -> int:
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def _too_large(limit: int) -> tuple[str, str, dict[str, Any]]:
    return (
        "payload_too_large",
        f"The request body is larger than the limit of {limit} bytes.",
        {"limit_bytes": limit},
    )


def too_large_response() -> JsonResponse:
    return JsonResponse(error_body(*_too_large(_body_limit())), status=413)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(error_body("not_found", f"No endpoint at {request.path}."), status=404)
    return page_not_found(request, exception or Http404())


def handler500(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse(
            error_body(
                "internal_error",
                INTERNAL_ERROR_MESSAGE,
            ),
            status=500,
        )
    return server_error(request)
