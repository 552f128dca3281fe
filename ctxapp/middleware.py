from __future__ import annotations

import logging
import os
from collections.abc import Callable

from asgiref.sync import async_to_sync, sync_to_async
from csp.middleware import CheckableLazyObject, CSPMiddleware
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.http.response import HttpResponseBase
from servestatic.middleware import ServeStaticMiddleware

from ctxapp.api_errors import DATABASE_RETRY_AFTER_SECONDS, error_body, too_large_response

logger = logging.getLogger(__name__)


class BodySizeLimitMiddleware:
    """Answer 413 for a body over the limit, before anything parses it.

    With a Content-Length header the header decides, before the body is read. A chunked body
    (no Content-Length) has already been buffered by Django's ASGI handler into a temporary file:
    its real size decides, and is then set as Content-Length, because Django REST framework
    ignores a body whose request announces no length (it would parse `{}` instead).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        length = request.META.get("CONTENT_LENGTH")
        if length and length.isdigit():
            if limit is not None and int(length) > limit:
                return too_large_response()
        else:
            stream = getattr(request, "_stream", None)
            if stream is not None and getattr(stream, "seekable", lambda: False)():
                size = stream.seek(0, os.SEEK_END)
                stream.seek(0)
                if limit is not None and size > limit:
                    return too_large_response()
                if size:
                    request.META["CONTENT_LENGTH"] = str(size)
        return self.get_response(request)


class UnstorableTextMiddleware:
    """Refuse a NUL character in the URL before any view reads it.

    PostgreSQL text cannot hold NUL, so an id such as `/sessions/sess_%00` (or `?session=%00`)
    would reach a lookup and fail in the database driver as a 500. A path with NUL names nothing
    that can exist: 404, like any unknown id (the API answers it with the JSON envelope). A query
    parameter with NUL is bad input: the API answers 422 naming the parameter.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path_info:
            raise Http404("No object has an id with a NUL character.")
        for name, values in request.GET.lists():
            if "\x00" in name or any("\x00" in value for value in values):
                problem = "Contains a NUL character (\\u0000), which no stored value can hold."
                field = name.replace("\x00", "\\u0000")
                if not request.path.startswith("/api/"):
                    return HttpResponseBadRequest(problem)
                return JsonResponse(
                    error_body("validation_error", f"{field}: {problem}", {"fields": {field: [problem]}}),
                    status=422,
                )
        return self.get_response(request)


class DatabaseUnavailableMiddleware:
    """A page or the admin whose database went away (a restart, a failover, a full pool) answers
    503 with Retry-After, as the API does, instead of a 500: nothing failed that a retry will not
    fix. The API answers through its own exception handler (ctxapp/api_errors.py)."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.warning("database unavailable for %s: %s", request.path, exception)
        response = HttpResponse(
            "The database is not reachable right now. Retry in a few seconds.",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return response


class StaticFilesMiddleware:
    """ServeStatic's middleware, in the synchronous middleware pass (static files still stream
    asynchronously).

    Under ASGI Django runs a stack of synchronous middleware in one worker thread, but it switches
    to the event loop and back around every async-only middleware, and then runs each
    synchronous middleware's hooks in their own thread switch (`MiddlewareMixin.__acall__`).
    ServeStatic's middleware is async-only: in the middle of the stack it split a request into
    about twenty thread switches (an API append measured 20 `sync_to_async` calls; ≈ 0.2 ms each
    on this machine under load). This one is synchronous; a request under the static prefix (or
    for a file ServeStatic knows) goes to ServeStatic itself, on the event loop as before.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.static = ServeStaticMiddleware(sync_to_async(get_response, thread_sensitive=True))

    def __call__(self, request: HttpRequest) -> HttpResponse:
        path = request.path_info
        if path.startswith(self.static.static_prefix) or path in self.static.files:
            return async_to_sync(self.static)(request)
        return self.get_response(request)


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, without building the policy for a path that is left out of it.

    django-csp builds both policies (enforced and report-only) for every response and only then
    looks at EXCLUDE_URL_PREFIXES: ≈ 0.15 ms per API request (/api/ is left out) for a header it
    never sets. A path left out of every configured policy gets the same answer without that.
    """

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if not self._left_out(request.path_info):
            return super().process_response(request, response)
        if getattr(request, "_csp_nonce", None) is None:  # as django-csp: no nonce from here on
            request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)  # type: ignore[attr-defined]
        return response

    @staticmethod
    def _left_out(path: str) -> bool:
        """Whether every configured policy (enforced, report-only) excludes this path."""
        policies = [
            policy
            for policy in (
                getattr(settings, "CONTENT_SECURITY_POLICY", None),
                getattr(settings, "CONTENT_SECURITY_POLICY_REPORT_ONLY", None),
            )
            if policy
        ]
        return bool(policies) and all(
            path.startswith(tuple(policy.get("EXCLUDE_URL_PREFIXES") or ())) for policy in policies
        )
