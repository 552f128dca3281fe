"""Static files come from the ASGI process itself, streamed asynchronously."""

from __future__ import annotations

import warnings

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient


@pytest.mark.django_db
def test_static_files_stream_under_asgi_without_the_sync_iterator_warning() -> None:
    async def fetch() -> tuple[int, bytes]:
        response = await AsyncClient().get("/static/dashboard/dashboard.css")
        return response.status_code, b"".join([chunk async for chunk in response.streaming_content])

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Django warns when it must consume a sync iterator
        status, body = async_to_sync(fetch)()
    assert status == 200 and b".topbar" in body
