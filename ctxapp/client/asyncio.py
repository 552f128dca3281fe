"""The asynchronous transport: `AsyncClient` sends the core's requests with httpx.AsyncClient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import httpx

from ctxapp.client._core import DEFAULT_RETRIES, DEFAULT_TIMEOUT, AsyncSender, Pages, Request
from ctxapp.client._operations import Operations

T = TypeVar("T")


class AsyncClient(Operations, AsyncSender):
    """Asynchronous client (httpx.AsyncClient); the same methods as `Client`, awaited."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout=timeout, retries=retries)
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, request: Request[T]) -> T:
        exchange = self._exchange(request)
        for attempt in exchange.attempts:
            try:
                response = await self._http.send(exchange.http_request(self._http.timeout))
            except httpx.TransportError as exc:
                await asyncio.sleep(exchange.delay_after_failure(attempt, exc))
                continue
            delay = exchange.delay_before_retry(attempt, response)
            if delay is None:
                return exchange.result(response)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _iterate(self, pages: Pages[T]) -> AsyncIterator[T]:
        request: Request[Any] | None = pages.first()
        while request is not None:
            page = await self._send(request)
            for item in page["items"]:
                yield item
            request = pages.following(page)

    def _bind(self, build: Callable[..., Request[Any]]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._send(build(*args, **kwargs))

        return call

    def _bind_pages(self, build: Callable[..., Pages[Any]]) -> Callable[..., AsyncIterator[Any]]:
        return lambda *args, **kwargs: self._iterate(build(*args, **kwargs))
