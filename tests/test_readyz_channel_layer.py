"""/readyz's channel-layer check tells the truth about the server, not about one pooled connection.

The Redis-killed soak drill once saw `/readyz` answer 503 ("channel_layer: ConnectionError:
Connection closed by server") 50 s after Redis came back, every request answered meanwhile: a
pooled connection found closed on its first use. Here a proxy in front of the tests' real Redis
closes a connection when it sends its next command, as such a server does; then it refuses
every command, as a server that is down does."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
import redis.exceptions
from channels.layers import channel_layers
from django.conf import settings as django_settings

from ctxapp import health


class ClosingProxy:
    """Loopback TCP → the tests' Redis (its Unix socket or TCP address). `close_next` makes the
    next command on any connection close that connection unanswered; `refuse` does it to every
    command."""

    def __init__(self, upstream_url: str) -> None:
        self.upstream = urlparse(upstream_url)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.close_next = threading.Event()
        self.refuse = threading.Event()
        self.closed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _connect_upstream(self) -> socket.socket:
        if self.upstream.scheme == "unix":
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.upstream.path)
            return upstream
        return socket.create_connection((self.upstream.hostname, self.upstream.port or 6379))

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while True:
                client, _ = self.listener.accept()
                upstream = self._connect_upstream()
                threading.Thread(target=self._pump_commands, args=(client, upstream), daemon=True).start()
                threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump_commands(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.refuse.is_set() or self.close_next.is_set():
                    self.close_next.clear()
                    self.closed += 1
                    break
                upstream.sendall(data)
        for end in (client, upstream):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def layer_through_proxy(settings: Any) -> Iterator[ClosingProxy]:
    proxy = ClosingProxy(django_settings.REDIS_URL)
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{proxy.port}/0"}], "prefix": "readyz-test"},
        }
    }
    channel_layers.backends.pop("default", None)
    try:
        yield proxy
    finally:
        channel_layers.backends.pop("default", None)
        proxy.close()


def test_a_pooled_connection_the_server_closed_does_not_make_the_layer_look_down(layer_through_proxy):
    proxy = layer_through_proxy
    assert health.check_channel_layer()["ok"]  # the pool now holds a connection
    proxy.close_next.set()
    assert health.check_channel_layer()["ok"]
    assert proxy.closed == 1  # the check met the closed connection, and answered ok on a new one


def test_a_server_that_answers_no_command_is_reported_down(layer_through_proxy):
    proxy = layer_through_proxy
    assert health.check_channel_layer()["ok"]
    proxy.refuse.set()
    with pytest.raises(redis.exceptions.ConnectionError):
        health.check_channel_layer()  # /readyz reports it as "channel_layer: ConnectionError: …"
    assert proxy.closed >= 2  # the first try and the one more
