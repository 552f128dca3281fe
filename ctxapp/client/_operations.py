"""Every API operation of the client, gathered for both transports."""

from __future__ import annotations

from ctxapp.client._conversation import ConversationOps
from ctxapp.client._knowledge import KnowledgeOps
from ctxapp.client._users import UserMemoryOps


class Operations(ConversationOps, KnowledgeOps, UserMemoryOps):
    """The operations as methods; a transport base class (SyncSender, AsyncSender) decides whether
    they return results or coroutines."""
