"""The dashboard's live channel: one websocket per open page.

`connect` authorises: the user must be logged in and allowed to see the page's tenant (member
or staff), and the page's session/agent must belong to that tenant; anything else is refused
before the handshake completes. The consumer then joins the tenant's group
(`memory.services.broadcast.tenant_group`), where every recorded event arrives after its transaction
commits as `{"type": "ctx.events", "events": [...]}`.

Updates are coalesced: an event only marks panels stale; at most once per flush interval
(CTXAPP_DASHBOARD_FLUSH_MS, 400 ms by default) the stale panels are re-rendered with the same
partial templates the page used and sent as htmx out-of-band swaps. A burst of 1,000 messages
therefore costs one render, not 1,000.

Reconnects: the page's script sends `{"hello": {"last_seq": N}}` on every (re)connect; the
consumer answers at once with every live panel re-rendered and the messages after N (or the
newest page, replacing the list, if more than a page was missed), so nothing is lost or shown twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string

from dashboard import access, panels, selectors
from memory.exceptions import NotFound
from memory.selectors.sessions import agent_get, session_get
from memory.services.broadcast import tenant_group

logger = logging.getLogger(__name__)


# A private close code (4000-4999): the htmx extension does not reconnect after it.
CLOSE_FORBIDDEN = 4403


def flush_interval() -> float:
    return float(settings.CTXAPP.dashboard_flush_ms) / 1000.0


class DashboardConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.group: str | None = None
        self.dirty: set[str] = set()
        self.messages_dirty = False
        self.last_seq = 0
        self.flush_task: asyncio.Task[None] | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        params = {k: v[0] for k, v in parse_qs(self.scope.get("query_string", b"").decode()).items()}
        resolved = await database_sync_to_async(self._resolve)(user, params)
        if resolved is None:
            await self.close()
            return
        self.group = tenant_group(self.tenant.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.renew_task = asyncio.create_task(self._renew_membership())

    async def _renew_membership(self) -> None:
        # Group membership expires (CTXAPP_CHANNEL_GROUP_EXPIRY) so a page whose process died
        # without discarding stops costing a message per event; an open page renews it.
        every = max(1.0, float(settings.CTXAPP.channel_group_expiry) / 3)
        while self.group is not None:
            await asyncio.sleep(every)
            try:
                await self.channel_layer.group_add(self.group, self.channel_name)
            except Exception:  # the layer is down: try again next time
                logger.warning("dashboard group membership not renewed", exc_info=True)

    def _resolve(self, user: Any, params: dict[str, str]) -> bool | None:
        """Tenant and page scope, or None to refuse (not allowed, unknown page, foreign id)."""
        self.page = params.get("page", "")
        if self.page not in panels.PAGE_PANELS:
            return None
        tenant = access.tenants_for_user(user=user).filter(slug=params.get("tenant", "")).first()
        if tenant is None:
            session = self.scope.get("session")
            tenant_id = session.get(access.SESSION_KEY) if session is not None else None
            tenant = access.tenant_for_user(user=user, tenant_id=tenant_id)
        if tenant is None:
            return None
        self.tenant = tenant
        self.scope_kwargs: dict[str, Any] = {"tenant": tenant}
        self.session_id = self.agent_id = None
        self.live_panels = list(panels.PAGE_PANELS[self.page])
        try:
            if self.page == "session":
                session = session_get(tenant=tenant, session_id=params.get("session", ""))
                self.scope_kwargs["session"] = session
                self.session_id = session.public_id
                self.last_seq = session.message_seq
            elif self.page == "user":
                user_id = params.get("user", "")
                if not selectors.user_known(tenant=tenant, user_id=user_id):
                    return None
                self.scope_kwargs["user_id"] = user_id
            elif self.page == "agent":
                agent = agent_get(tenant=tenant, external_id=params.get("agent", ""))
                self.scope_kwargs["agent"] = agent
                self.agent_id = agent.external_id
                if params.get("events") == "off":
                    self.live_panels.remove("agent-events")
        except NotFound:
            return None
        return True

    async def disconnect(self, code: int) -> None:
        if self.flush_task is not None:
            self.flush_task.cancel()
        renew_task = getattr(self, "renew_task", None)
        if renew_task is not None:
            renew_task.cancel()
        if self.group is not None:
            group, self.group = self.group, None
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "{}")
        except ValueError:
            return
        hello = message.get("hello") if isinstance(message, dict) else None
        if isinstance(hello, dict):
            last_seq = hello.get("last_seq")
            if isinstance(last_seq, int) and last_seq >= 0:
                self.last_seq = last_seq
            self.dirty.update(self.live_panels)
            self.messages_dirty = self.page == "session"
            self._schedule(delay=0.0)

    # Handler name follows the group message type "ctx.events".
    async def ctx_events(self, message: dict[str, Any]) -> None:
        for event in message.get("events", []):
            if not self._relevant(event):
                continue
            event_type = str(event.get("type", ""))
            self.dirty.update(name for name in self.live_panels if panels.panel_is_stale(name, event_type))
            if self.page == "session" and event_type == "message.added":
                self.messages_dirty = True
        if self.dirty or self.messages_dirty:
            self._schedule(delay=flush_interval())

    def _relevant(self, event: dict[str, Any]) -> bool:
        if self.page == "session":
            return event.get("session") == self.session_id
        if self.page == "agent":
            return event.get("agent") == self.agent_id
        return True

    def _schedule(self, *, delay: float) -> None:
        if self.flush_task is None or self.flush_task.done():
            self.flush_task = asyncio.create_task(self._flush_loop(delay))

    def _still_allowed(self) -> bool:
        user = self.scope["user"]
        user.refresh_from_db(fields=["is_active", "is_staff"])
        return access.tenant_for_user(user=user, tenant_id=self.tenant.pk) is not None

    async def _flush_loop(self, delay: float) -> None:
        # Single-threaded event loop: between the `while` test and clearing flush_task there is
        # no await, so an event can never slip in unseen.
        while self.dirty or self.messages_dirty:
            await asyncio.sleep(delay)
            delay = flush_interval()
            # Membership is re-checked before every push, so removing a member (or deactivating
            # the user) stops their live updates at once, not at their next reconnect.
            if not await database_sync_to_async(self._still_allowed)():
                self.flush_task = None
                await self.close(code=CLOSE_FORBIDDEN)
                return
            dirty, self.dirty = self.dirty, set()
            with_messages, self.messages_dirty = self.messages_dirty, False
            try:
                html = await database_sync_to_async(self._render)(dirty, with_messages)
            except Exception:
                logger.exception("dashboard live render failed (page %s)", self.page)
                continue
            if html:
                await self.send(text_data=html)
        self.flush_task = None

    def _render(self, dirty: set[str], with_messages: bool) -> str:
        parts = []
        if with_messages:
            parts.append(self._render_messages())
        for name in self.live_panels:  # page order, stable output
            if name in dirty:
                parts.append(panels.panel_render(name, **self.scope_kwargs))
        return "".join(parts)

    def _render_messages(self) -> str:
        session = self.scope_kwargs["session"]
        size = selectors.MESSAGE_PAGE_SIZE
        new = selectors.messages_after(
            tenant=self.tenant, session=session, after=self.last_seq, limit=size + 1
        )
        if not new:
            return ""
        self.last_seq = max(self.last_seq, new[0].seq)
        if len(new) > size:  # missed more than a page: show the newest page, like a fresh load
            page = selectors.messages_page(tenant=self.tenant, session=session)
            body = render_to_string(
                "dashboard/partials/_message_page.html", {"session": session, "messages_page": page}
            )
            return f'<div id="message-list" class="message-list" hx-swap-oob="innerHTML">{body}</div>'
        rows = "".join(render_to_string("dashboard/partials/_message_row.html", {"m": m}) for m in new)
        return f'<div id="message-list" hx-swap-oob="afterbegin">{rows}</div>'
