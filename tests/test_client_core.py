"""The client's sans-IO core decides, without any I/O, what is sent, what is retried and what a
caller gets back; both transports (Client, AsyncClient) only carry out these decisions."""

from __future__ import annotations

import httpx
import pytest

from ctxapp import client as ctx
from ctxapp.client import Client
from ctxapp.client._core import BACKOFF_MAX, Exchange, Request


def _exchange(request: Request[object], retries: int = 3) -> Exchange[object]:
    return Exchange(request, base_url="http://ctx.example", api_key="ctx_k", retries=retries)


def _error(status: int, code: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"error": {"code": code, "message": code, "details": {}}}
    return httpx.Response(status, json=body, headers=headers)


def test_a_write_carries_one_idempotency_key_and_a_read_none() -> None:
    write = _exchange(Client.message_append.build("S1", role="user", content="hi"))
    assert write.http_args["method"] == "POST"
    assert write.http_args["url"] == "http://ctx.example/api/v1/sessions/S1/messages"
    assert write.http_args["json"] == {"role": "user", "content": "hi"}
    assert write.http_args["headers"]["Authorization"] == "Bearer ctx_k"
    assert len(write.http_args["headers"]["Idempotency-Key"]) == 32
    given = _exchange(Client.session_end.build("S1", idempotency_key="k-1"))
    assert given.http_args["headers"]["Idempotency-Key"] == "k-1"
    read = _exchange(Client.messages_list.build("S1", after=3))
    assert "Idempotency-Key" not in read.http_args["headers"]
    assert read.http_args["params"] == {"after": 3}  # None values are left out


def test_what_is_retried_and_for_how_long() -> None:
    exchange = _exchange(Client.session_get.build("S1"), retries=2)
    assert exchange.delay_before_retry(0, _error(503, "unavailable")) is not None
    assert exchange.delay_before_retry(0, _error(429, "rate_limited", {"Retry-After": "2"})) == 2.0
    assert exchange.delay_before_retry(0, _error(429, "rate_limited", {"Retry-After": "90"})) == BACKOFF_MAX
    assert exchange.delay_before_retry(0, _error(409, "idempotency_in_progress")) is not None
    assert exchange.delay_before_retry(0, _error(409, "session_ended")) is None
    assert exchange.delay_before_retry(0, _error(404, "not_found")) is None
    assert exchange.delay_before_retry(2, _error(503, "unavailable")) is None  # the last attempt
    failure = httpx.ConnectError("refused")
    assert 0 <= exchange.delay_after_failure(1, failure) <= BACKOFF_MAX
    with pytest.raises(ctx.NetworkError) as raised:
        exchange.delay_after_failure(2, failure)
    assert raised.value.code == "network_error" and raised.value.status == 0


def test_answers_become_results_or_the_exception_of_their_code() -> None:
    builds = _exchange(Client.context_builds.build("S1"))
    assert builds.result(httpx.Response(200, json={"builds": [{"id": "b1"}]})) == [{"id": "b1"}]
    assert _exchange(Client.session_delete.build("S1")).result(httpx.Response(204)) is None
    with pytest.raises(ctx.SessionEnded) as ended:
        builds.result(_error(409, "session_ended"))
    assert ended.value.status == 409 and ended.value.code == "session_ended"
    with pytest.raises(ctx.NotFound):
        builds.result(httpx.Response(404, text="<html>not here</html>"))  # no JSON: by status


def test_a_listing_follows_its_cursor_until_the_last_page() -> None:
    pages = Client.sessions_iter.build(agent="bot")
    first = pages.first()
    assert first.path == "/sessions"
    assert (first.params or {})["cursor"] is None and (first.params or {})["agent"] == "bot"
    following = pages.following({"items": [], "next_cursor": "c2"})
    assert following is not None and (following.params or {})["cursor"] == "c2"
    assert (following.params or {})["agent"] == "bot"
    assert pages.following({"items": [], "next_cursor": None}) is None
    events = Client.events_iter.build("bot", after=5)
    assert (events.first().params or {})["after"] == 5
    assert events.following({"items": [], "next_after": None}) is None


def test_what_goes_on_the_wire_keeps_the_timeout_the_key_and_the_query_over_retries() -> None:
    # The request is built once, outside httpx.Client.request: it must still carry the
    # client's timeout, and every retry resends the same Idempotency-Key and body.
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) == 1:
            return _error(503, "database_unavailable", {"Retry-After": "0"})
        return httpx.Response(201, json={"seq": 1})

    api = Client("http://ctx.example", "ctx_k", timeout=7.5, transport=httpx.MockTransport(handler))
    assert api.message_append("S1", role="user", content="hi") == {"seq": 1}
    first, retry = sent
    assert first.extensions["timeout"] == httpx.Timeout(7.5).as_dict()
    assert first.headers["Idempotency-Key"] == retry.headers["Idempotency-Key"]
    assert first.headers["Authorization"] == "Bearer ctx_k" and first.headers["Host"] == "ctx.example"
    assert first.content == retry.content and b'"content"' in first.content
    query = _exchange(Client.messages_list.build("S1", after=3)).http_request(httpx.Timeout(1))
    assert query.url.params["after"] == "3" and "limit" not in query.url.params  # None left out


def test_every_method_shows_its_parameters_and_answer_to_inspect_and_help() -> None:
    import inspect
    import pydoc

    from ctxapp.client import AsyncClient, Client

    sync = Client("http://127.0.0.1:9", api_key="k")
    asynchronous = AsyncClient("http://127.0.0.1:9", api_key="k")
    methods = {n for klass in Client.__mro__ for n, v in vars(klass).items() if hasattr(v, "build")}
    assert {"fact_register", "sessions_list"} <= methods
    for name in methods:
        on_class = inspect.signature(getattr(Client, name))
        assert next(iter(on_class.parameters)) == "self", name
        for bound in (getattr(sync, name), getattr(asynchronous, name)):
            signature = inspect.signature(bound)
            assert list(signature.parameters) == list(on_class.parameters)[1:], name
            shown = str(signature.return_annotation)
            assert "Request" not in shown and "Pages" not in shown, (name, shown)
        assert inspect.iscoroutinefunction(getattr(asynchronous, name)) or "Iterator" in str(
            inspect.signature(getattr(asynchronous, name)).return_annotation
        ), name
    page = pydoc.render_doc(Client, renderer=pydoc.TextDoc())
    page = pydoc.plain(page)
    assert "fact_register(self, /, session_id" in page and "fact_register(...)" not in page
