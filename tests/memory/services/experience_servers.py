"""Test doubles for REMOTE endpoints only: an OpenAI-compatible embeddings / chat server.

A real HTTP server on 127.0.0.1 in a thread. Embeddings are deterministic bag-of-words vectors
(each word hashed to one of 384 dimensions), so equal texts give equal vectors.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np


def fake_vector(text: str) -> list[float]:
    vector = np.zeros(384, dtype=np.float64)
    for word in text.lower().split():
        vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % 384] += 1.0
    vector[0] += 0.01
    return (vector / np.linalg.norm(vector)).tolist()


class FakeOpenAI:
    """mode: "ok" | "fail" (HTTP 500) | "hang" (the next request blocks until `release()`).

    `fail_next`: answers (status, headers) the next embeddings requests get, one each, before the
    mode applies; `stall_next`: seconds the next embeddings requests wait before answering."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.embed_requests: list[list[str]] = []
        self.fail_next: list[tuple[int, dict[str, str]]] = []
        self.stall_next: list[float] = []
        self.chat_requests: list[dict[str, Any]] = []
        self.chat_replies: list[str] = []
        self.request_arrived = threading.Event()
        self._release = threading.Event()
        self.chat_handler: Callable[[dict[str, Any]], str] | None = None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/embeddings"):
                    owner.embed_requests.append(list(body["input"]))
                    owner.request_arrived.set()
                    if owner.mode == "hang":
                        owner._release.wait(60)
                    if owner.stall_next:
                        owner._release.wait(owner.stall_next.pop(0))
                    if owner.fail_next:
                        status, headers = owner.fail_next.pop(0)
                        return self._send(status, {"error": {"message": "try later"}}, headers)
                    if owner.mode == "fail":
                        return self._send(500, {"error": {"message": "model overloaded"}})
                    data = [
                        {"index": i, "embedding": fake_vector(t), "object": "embedding"}
                        for i, t in enumerate(body["input"])
                    ]
                    return self._send(200, {"data": data, "model": body["model"]})
                if self.path.endswith("/chat/completions"):
                    owner.chat_requests.append(body)
                    reply = owner.chat_replies.pop(0) if owner.chat_replies else "{}"
                    return self._send(
                        200, {"choices": [{"message": {"role": "assistant", "content": reply}}]}
                    )
                return self._send(404, {})

            def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def release(self) -> None:
        self.mode = "ok"
        self._release.set()

    def texts_embedded(self) -> list[str]:
        return [t for batch in self.embed_requests for t in batch]

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
