"""The synchronous transport: `Client` sends the core's requests with httpx.Client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

from ctxapp.client._core import DEFAULT_RETRIES, DEFAULT_TIMEOUT, Pages, Request, SyncSender
from ctxapp.client._operations import Operations

T = TypeVar("T")


class Client(Operations, SyncSender):
    """Synchronous client. Thread-safe (one httpx.Client, one connection pool).

    `transport` lets tests and callers swap the httpx transport (e.g. to inject faults).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, retries=retries)
        self._http = httpx.Client(timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, request: Request[T]) -> T:
        exchange = self._exchange(request)
        for attempt in exchange.attempts:
            try:
                response = self._http.send(exchange.http_request(self._http.timeout))
            except httpx.TransportError as exc:
                time.sleep(exchange.delay_after_failure(attempt, exc))
                continue
            delay = exchange.delay_before_retry(attempt, response)
            if delay is None:
                return exchange.result(response)
            time.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _iterate(self, pages: Pages[T]) -> Iterator[T]:
        request: Request[Any] | None = pages.first()
        while request is not None:
            page = self._send(request)
            yield from page["items"]
            request = pages.following(page)

    def _bind(self, build: Callable[..., Request[Any]]) -> Callable[..., Any]:
        return lambda *args, **kwargs: self._send(build(*args, **kwargs))

    def _bind_pages(self, build: Callable[..., Pages[Any]]) -> Callable[..., Iterator[Any]]:
        return lambda *args, **kwargs: self._iterate(build(*args, **kwargs))
