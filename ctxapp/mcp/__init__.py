"""The Model Context Protocol: ctxapp memory as MCP tools (tools.py), served at /mcp (http.py)."""
