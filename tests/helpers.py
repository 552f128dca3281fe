"""Helpers shared by several test modules."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections


@contextlib.contextmanager
def in_process_transport() -> Iterator[httpx.WSGITransport]:
    """An httpx transport into this process's Django, on the test's transaction.

    Like Django's test client, it keeps the test's connection (and its transaction) open across
    requests; Django's own test client reconnects close_old_connections after each request, so
    do not call it inside this block.
    """
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield httpx.WSGITransport(app=get_wsgi_application())
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
