"""`ctxapp mcp`: the MCP tools over stdio, each tool call one REST request through the Python
client (`ClientBackend`), to the server at CTXAPP_URL with CTXAPP_API_KEY. The tools themselves:
ctxapp/mcp/tools.py, shared with the server's own /mcp endpoint."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from mcp.types import Tool

from ctxapp.client import Client, CtxappError, NetworkError
from ctxapp.client._core import Request, operation
from ctxapp.client.errors import error_from_response
from ctxapp.mcp.schema import Call, RestError, ToolSpec
from ctxapp.mcp.tools import build_server, current_backend


class ToolClient(Client):
    """The Python client, with the operations the tools need: any request under /api/v1, the
    key's scopes, and a request to the server's own MCP endpoint (its tool list)."""

    @operation
    def tool_request(call: Call) -> Request[Any]:
        return Request(call.method, call.path, params=call.params, json=call.body)

    @operation
    def tenant_scopes() -> Request[Any]:
        return Request("GET", "/tenant", parse=lambda body: body["scopes"])

    def mcp_request(self, method: str) -> Any:
        """One JSON-RPC request to the server's streamable HTTP endpoint (stateless JSON mode)."""
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {}}
        headers = {
            "Authorization": f"Bearer {self.api_key}",
            "Accept": "application/json, text/event-stream",
        }
        response = self._http.post(f"{self.base_url}/mcp", json=body, headers=headers)
        if response.status_code >= 400:
            raise error_from_response(response)
        answer = response.json()
        if "error" in answer:
            raise CtxappError(str(answer["error"].get("message", "")), code="mcp_error")
        return answer["result"]


class ClientBackend:
    """Over the REST API with the Python client (the stdio transport)."""

    def __init__(self, client: ToolClient) -> None:
        self.client = client
        self._scopes: frozenset[str] | None = None
        self._tools: list[Tool] | None = None

    async def send(self, call: Call) -> Any:
        try:
            return await asyncio.to_thread(self.client.tool_request, call)
        except CtxappError as exc:
            raise RestError(exc.code, exc.message, exc.details) from None

    async def scopes(self) -> frozenset[str]:
        if self._scopes is None:
            try:
                tenant = await self.send(Call("GET", "/tenant"))
                self._scopes = frozenset(tenant["scopes"])
            except RestError as exc:
                if exc.code != "forbidden":
                    raise
                # GET /tenant needs `read`; a key refused it has neither read nor admin: write only.
                self._scopes = frozenset({"write"})
        return self._scopes

    async def tools(self, specs: list[ToolSpec]) -> list[Tool]:
        """The server's own list (its /mcp endpoint), so the bounds are those it enforces."""
        if self._tools is None:
            listed = await asyncio.to_thread(self.client.mcp_request, "tools/list")
            self._tools = [Tool.model_validate(tool) for tool in listed["tools"]]
        return self._tools


def key_refusal(client: ToolClient) -> str | None:
    """Why the server refuses this key (or cannot be reached), in one line; None when it is usable."""
    try:
        client.tenant_scopes()
    except CtxappError as exc:
        if exc.code == "forbidden":  # a write-only key: the tools it may call still work
            return None
        if isinstance(exc, NetworkError):
            return f"ctxapp mcp: cannot reach the ctxapp server at {client.base_url}: {exc.message}"
        return f"ctxapp mcp: {client.base_url} refused the API key ({exc.code}): {exc.message}"
    return None


def run_stdio(*, url: str, api_key: str) -> int:
    """Serve the tools on stdin/stdout, calling the REST API at `url` with `api_key`. A key the
    server refuses, or a server it cannot reach, is said in one line on stderr (exit status 2)
    before anything is served: an MCP host shows a server's stderr when it fails to start."""
    # One line per HTTP request at INFO would fill the host's log of this server's stderr.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    server = build_server()
    client = ToolClient(url, api_key)
    with client:
        refused = key_refusal(client)
        if refused is not None:
            print(refused, file=sys.stderr)
            return 2
        current_backend.set(ClientBackend(client))
        server.run("stdio")
    return 0
