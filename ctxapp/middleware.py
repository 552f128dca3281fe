from __future__ import annotations

import os
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from ctxapp.api_errors import too_large_response


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
