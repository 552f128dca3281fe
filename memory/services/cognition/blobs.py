"""Blobs: large values an agent keeps beside its checkpoints and events, addressed by the SHA-256
of their bytes (the checkpoint or event carries that reference, not the bytes).

Storing the same bytes again stores nothing; a blob goes when its agent is deleted. Bounded only
by the request body's limit (CTXAPP_MAX_BODY_BYTES, base64 in JSON: about three quarters of it).
"""

from __future__ import annotations

import hashlib
import re

from django.db import IntegrityError, transaction

from memory.exceptions import InvalidInput, NotFound
from memory.models import Agent, AgentBlob, Tenant

SHA256 = re.compile(r"^[0-9a-f]{64}$")


def blob_put(*, tenant: Tenant, agent: Agent, sha256: str, data: bytes) -> tuple[AgentBlob, bool]:
    """Store `data` under its SHA-256 for the agent; (the blob without its bytes, created?).

    Raises InvalidInput (422) when `sha256` is not the SHA-256 of `data` (lowercase hex)."""
    if not SHA256.match(sha256):
        raise InvalidInput(
            "A blob is named by the SHA-256 of its bytes, 64 lowercase hex digits.",
            details={"fields": {"sha256": ["Must be 64 lowercase hex digits."]}},
        )
    if hashlib.sha256(data).hexdigest() != sha256:
        raise InvalidInput(
            "The data's SHA-256 is not the one in the URL: the blob arrived damaged, or under another name.",
            details={"fields": {"base64": ["Its SHA-256 differs from the URL's."]}},
        )
    found = AgentBlob.objects.filter(agent=agent, sha256=sha256).defer("data").first()
    if found is not None:
        return found, False
    try:
        with transaction.atomic():
            blob = AgentBlob.objects.create(
                tenant=tenant, agent=agent, sha256=sha256, size=len(data), data=data
            )
    except IntegrityError:  # the same bytes, stored meanwhile by a concurrent request
        return AgentBlob.objects.defer("data").get(agent=agent, sha256=sha256), False
    return blob, True


def blob_get(*, tenant: Tenant, agent: Agent, sha256: str) -> AgentBlob:
    """The agent's blob with these bytes' SHA-256. Raises NotFound."""
    blob = AgentBlob.objects.filter(tenant=tenant, agent=agent, sha256=sha256).first()
    if blob is None:
        raise NotFound.of("blob", sha256)
    return blob
