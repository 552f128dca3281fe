"""uvicorn's HTTP protocol with its one plain-text answer in our JSON error shape.

A request uvicorn's parser cannot read (a method it does not know, like `FOO /api/v1/tenant`, a
malformed request line or header) is answered by the server itself before any application code
runs: neither the ASGI app nor Django ever see it, so only the protocol can answer it. uvicorn
answers `400 Invalid HTTP request received.` as text/plain; this subclass sends the same 400 as
`{"error": {"code": "bad_request", "message", "details"}}`, like every other error of the API.
`ctxapp web` (and so `ctxapp up`) runs uvicorn with `--http ctxapp.infra.http_protocol:HttpProtocol`.

Only the public `send_400_response` of uvicorn's protocol is overridden; no Django import here:
uvicorn imports this module before it loads the application.
"""

from __future__ import annotations

import json

try:  # uvicorn[standard]: the C parser, uvicorn's own default
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - a platform without httptools wheels
    from uvicorn.protocols.http.h11_impl import H11Protocol as _Base  # type: ignore[assignment]

BAD_REQUEST_CODE = "bad_request"
BAD_REQUEST_MESSAGE = (
    "The server could not read this HTTP request: an unknown method, or a malformed request line or "
    "header. The API's methods are GET, POST, PUT, PATCH and DELETE (OPTIONS and HEAD too)."
)


def bad_request_body() -> bytes:
    """The JSON error sent for a request the HTTP parser refused."""
    body = {"error": {"code": BAD_REQUEST_CODE, "message": BAD_REQUEST_MESSAGE, "details": {}}}
    return json.dumps(body).encode()


class HttpProtocol(_Base):
    """uvicorn's HTTP/1.1 protocol; only its parse-error answer differs (JSON, not plain text)."""

    def send_400_response(self, msg: str) -> None:
        payload = bad_request_body()
        content = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(payload)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                payload,
            ]
        )
        self.transport.write(b"".join(content))
        self.transport.close()
