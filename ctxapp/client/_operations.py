"""Every API operation of the client, gathered for both transports."""

from __future__ import annotations

from ctxapp.client._conversation import ConversationOps
from ctxapp.client._knowledge import KnowledgeOps


class Operations(ConversationOps, KnowledgeOps):
    """The operations as methods; a transport base class (SyncSender, AsyncSender) decides whether
    they return results or coroutines."""
