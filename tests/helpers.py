"""Helpers shared by several test modules."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from asgiref.sync import async_to_sync
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, connection


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


def body_of(response: Any) -> bytes:
    """The whole body of a Django test response, streamed (sync or async iterator) or not."""
    if not getattr(response, "streaming", False):
        return bytes(response.content)
    if getattr(response, "is_async", False):

        async def read() -> bytes:
            return b"".join([chunk async for chunk in response.streaming_content])

        return async_to_sync(read)()
    return b"".join(response.streaming_content)


def run_together(
    calls: list[Callable[[], Any]], timeout: float = 120.0
) -> tuple[list[Any], list[BaseException]]:
    """Run each call on its own thread, all released at once (a barrier), each on its own database
    connection; returns (results, errors) once all have returned."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = []
    errors: list[BaseException] = []

    def run(call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=30)
            results.append(call())
        except BaseException as exc:  # handed to the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a call never returned"
    return results, errors
