"""What the agent-scoped views share: the calling agent (X-Agent-Id / as_agent) and If-Match.

The API key identifies the tenant, the `X-Agent-Id` header which of its agents is asking. A key
bound to an agent always acts as that agent. Used by memory/api/cognition.py (state, checkpoints,
recovery) and memory/api/task_context.py (the task context layers).
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from memory.api.base import TenantApiView
from memory.exceptions import AgentMismatch, InvalidInput
from memory.models import Agent
from memory.services.sessions import agent_get

AGENT_HEADER = "X-Agent-Id"
AS_AGENT_PARAM = OpenApiParameter(
    "as_agent",
    OpenApiTypes.STR,
    OpenApiParameter.QUERY,
    required=False,
    description="Alternative to the X-Agent-Id header, for clients that cannot set headers.",
)
AGENT_HEADER_PARAM = OpenApiParameter(
    AGENT_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="The external id of the agent making the call (must exist in the key's tenant).",
)
IF_MATCH_PARAM = OpenApiParameter(
    "If-Match",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="The version you read; a different stored version → 409 version_conflict.",
)
FREE_JSON = OpenApiTypes.OBJECT


class AgentScopedView(TenantApiView):
    def agent(self, external_id: str) -> Agent:
        return agent_get(tenant=self.tenant, external_id=external_id)

    def caller(self, *, required: bool) -> Agent | None:
        """The agent making the call: the key's bound agent, else the X-Agent-Id header or `as_agent`."""
        header = self.request.headers.get(AGENT_HEADER, "").strip()
        query = self.request.query_params.get("as_agent", "").strip()
        if header and query and header != query:
            raise InvalidInput(
                f"The {AGENT_HEADER} header and the as_agent parameter name different agents.",
                details={"fields": {AGENT_HEADER: ["Differs from as_agent."]}},
            )
        name = header or query
        bound = self.request.auth.agent_external_id  # type: ignore[union-attr]
        if bound:
            # A key bound to an agent always acts as that agent: naming another is refused.
            if name and name != bound:
                raise AgentMismatch(
                    f"This API key is bound to agent {bound!r}; it cannot act as {name!r}.",
                    details={"bound_agent": bound, "requested_agent": name},
                )
            name = bound
        if not name:
            if required:
                raise InvalidInput(
                    f"Send the {AGENT_HEADER} header (or ?as_agent=) naming the agent making this call.",
                    details={"fields": {AGENT_HEADER: ["This header is required."]}},
                )
            return None
        return agent_get(tenant=self.tenant, external_id=name)

    def expected_version(self) -> int | None:
        """The version the caller read: the If-Match header or the `expected_version` query parameter."""
        raw = self.request.headers.get("If-Match", "").strip().strip('"').removeprefix("v")
        raw = raw or self.request.query_params.get("expected_version", "").strip()
        if not raw:
            return None
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):  # "²".isdigit(); bigint range
            raise InvalidInput(
                "If-Match must be the version number you read.",
                details={"fields": {"If-Match": ["Not a version."]}},
            )
        return int(raw)


def bound_agent(view: TenantApiView) -> str | None:
    """The agent the caller's key is bound to (None for an unbound key): the scope of every read."""
    return view.request.auth.agent_external_id or None  # type: ignore[union-attr]


def agent_filter_for_read(view: TenantApiView, requested: str | None) -> str | None:
    """The `agent` filter of a list or search: a bound key reads only its own agent's rows.

    Naming another agent is refused (403 agent_mismatch) rather than silently answered empty, the
    same as a bound key acting as another agent.
    """
    bound = bound_agent(view)
    if bound and requested and requested != bound:
        raise AgentMismatch(
            f"This API key is bound to agent {bound!r}; it cannot read agent {requested!r}'s rows.",
            details={"bound_agent": bound, "requested_agent": requested},
        )
    return bound or requested
