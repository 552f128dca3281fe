"""ASGI entry point: HTTP through Django, websockets through Channels (dashboard live updates)."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

import ctxapp.celery  # noqa: E402,F401  (the Celery app the services send jobs through)
from ctxapp import metrics  # noqa: E402
from ctxapp.mcp import http as mcp_http  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402

MCP_PATHS = frozenset({"/mcp", "/mcp/"})

router = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)


async def application(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] in MCP_PATHS:
        # The MCP streamable HTTP transport (bearer key, then the SDK's transport): not Django.
        await metrics.observe_asgi(
            "mcp", scope, send, lambda timed_send: mcp_http.http_app()(scope, receive, timed_send)
        )
        return
    await router(scope, receive, send)
