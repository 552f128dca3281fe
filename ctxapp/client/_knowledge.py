"""The client's operations on experiences, cognition (state, checkpoints, shared and private
context, task messages) and decay (facts, compression): each one request builder, written once
for both clients (see _core.py)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from ctxapp.client._core import Request, as_dict, drop_none, field, operation
from ctxapp.client.types import ExperienceBulkOut, ExperiencePolicyOut, Page


class KnowledgeOps:
    """Request builders (no `self`: `@operation` / `@paginated` bind them to a client, which
    sends what they return). `KnowledgeOps.name.build(...)` is the `Request` itself, unsent."""

    # --- experiences ---
    @operation
    def experience_create(
        problem: str,
        *,
        solution: str = "",
        cause: str = "",
        confidence: float | None = None,
        user_id: str | None = None,
        scope: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        task: str | None = None,
        supersedes: str | None = None,
        agent: str | None = None,
        merge: bool | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Store an experience (embedded asynchronously). `outcome` is created, or merged for an
        exact duplicate (`merge=False`: always a new row); `supersedes` hides that older
        experience behind this one; `agent` records which agent learnt it."""
        body = drop_none(
            {"problem": problem, "solution": solution, "cause": cause, "confidence": confidence,
             "user_id": user_id, "scope": scope, "kind": kind, "key": key, "task": task,
             "supersedes": supersedes, "agent": agent, "merge": merge}
        )  # fmt: skip
        return Request("POST", "/experiences", json=body, idempotency_key=idempotency_key)

    @operation
    def experiences_create_bulk(
        items: list[Mapping[str, Any]], *, task: str | None = None, idempotency_key: str | None = None
    ) -> Request[ExperienceBulkOut]:
        """Create up to 1,000 experiences in one call, all or nothing (each item like
        experience_create's arguments: problem, solution, cause, confidence, user_id, scope, kind,
        key, agent, merge). Their embeddings are queued in batches."""
        body = drop_none({"items": [dict(item) for item in items], "task": task})
        return Request("POST", "/experiences/bulk", json=body, idempotency_key=idempotency_key)

    @operation
    def experience_delete(experience_id: str, *, idempotency_key: str | None = None) -> Request[None]:
        """Delete an experience (its hidden merged duplicates too; what it superseded comes back)."""
        return Request("DELETE", f"/experiences/{experience_id}", idempotency_key=idempotency_key)

    @operation
    def experience_policy_get() -> Request[ExperiencePolicyOut]:
        """The tenant's experience policy: capacity, merge rule, search weights (admin key)."""
        return Request("GET", "/tenant/policies/experiences")

    @operation
    def experience_policy_update(**changes: Any) -> Request[ExperiencePolicyOut]:
        """Change some experience policy fields, e.g. `capacity=20_000` (admin key)."""
        return Request("PATCH", "/tenant/policies/experiences", json=changes)

    @operation
    def experience_get(experience_id: str) -> Request[dict[str, Any]]:
        """One experience with provenance, merge and supersede links and embedding status."""
        return Request("GET", f"/experiences/{experience_id}")

    @operation
    def experiences_list(
        *, cursor: str | None = None, limit: int | None = None, **filters: Any
    ) -> Request[dict[str, Any]]:
        """A page {results, next_cursor}; filters: user_id, kind, embedding_status, extraction_method,
        include_superseded, as_of (ISO time), agent."""
        return Request("GET", "/experiences", params={"cursor": cursor, "limit": limit, **filters})

    @operation
    def experiences_search(
        query: str,
        *,
        user_id: str | None = None,
        limit: int | None = None,
        sources: list[str] | None = None,
        weights: Mapping[str, float] | None = None,
        fusion: str | None = None,
        include_superseded: bool | None = None,
        as_of: str | None = None,
        kind: str | None = None,
        agent: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Hybrid search: {results: [{experience, score, similarity, text_score, contributions}], plan,
        warnings}. `agent`: only experiences that agent recorded."""
        body = drop_none(
            {"query": query, "user_id": user_id, "limit": limit, "sources": sources,
             "weights": as_dict(weights), "fusion": fusion,
             "include_superseded": include_superseded, "as_of": as_of, "kind": kind, "agent": agent}
        )  # fmt: skip
        return Request("POST", "/experiences/search", json=body)

    @operation
    def experience_feedback(
        experience_id: str, *, helpful: bool, note: str = "", session: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:  # fmt: skip
        """Report whether an experience helped; ranking takes it into account."""
        body = drop_none({"helpful": helpful, "note": note, "session": session})
        return Request(
            "POST", f"/experiences/{experience_id}/feedback", json=body, idempotency_key=idempotency_key
        )

    @operation
    def experience_promote(
        kind: str, key: str, content: str, *, user_id: str | None = None, session: str | None = None,
        source: Any = None, idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:  # fmt: skip
        """Promote a preference / project_config / constraint to long-term (user-scoped) memory."""
        body = drop_none(
            {"kind": kind, "key": key, "content": content, "user_id": user_id, "session": session,
             "source": source}
        )  # fmt: skip
        return Request("POST", "/experiences/promote", json=body, idempotency_key=idempotency_key)

    @operation
    def experiences_retry_embeddings(experience_ids: list[str] | None = None) -> Request[dict[str, Any]]:
        """Re-queue failed embeddings (all of the tenant's, or these): {requeued}."""
        body = drop_none({"experiences": experience_ids})
        return Request("POST", "/experiences/embeddings/retry", json=body)

    @operation
    def task_distill(task_id: str, *, mode: str = "full") -> Request[dict[str, Any]]:
        """Distil a finished task: light (now, returns the experiences) or full (queued)."""
        return Request("POST", f"/tasks/{task_id}/distill", json={"mode": mode})

    # --- cognition ---
    # The calling agent of private context, messages and context views is `as_agent`
    # (the API also takes it as the X-Agent-Id header).
    @operation
    def state_get(agent: str) -> Request[dict[str, Any]]:
        """The agent's cognitive state (schema 1; version 0 and empty if never written)."""
        return Request("GET", f"/agents/{agent}/state")

    @operation
    def state_put(
        agent: str,
        state: dict[str, Any],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Replace the agent's cognitive state; `expected_version` → Conflict if it changed meanwhile."""
        return Request(
            "PUT",
            f"/agents/{agent}/state",
            json=state,
            params={"expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    @operation
    def state_patch(
        agent: str,
        patch: list[dict[str, Any]],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Change the agent's cognitive state by a JSON Patch (RFC 6902; paths relative to the state).

        A patch that does not apply → ValidationFailed (422 `invalid_patch`); nothing is stored."""
        return Request(
            "PATCH",
            f"/agents/{agent}/state",
            json={"patch": patch},
            params={"expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    @operation
    def state_restore(
        agent: str,
        checkpoint: str | int,
        *,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Make a checkpoint's state current again (a new state version and a new checkpoint)."""
        body = drop_none({"checkpoint": str(checkpoint), "reason": reason})
        return Request("POST", f"/agents/{agent}/state/restore", json=body, idempotency_key=idempotency_key)

    @operation
    def store_batch(ops: list[dict[str, Any]]) -> Request[list[Any]]:
        """Key-value store operations (get, put, search, list_namespaces), one result each, in order."""
        return Request("POST", "/store/batch", json={"ops": ops}, parse=field("results"))

    @operation
    def checkpoint_create(
        agent: str,
        *,
        reason: str | None = None,
        step: int | None = None,
        produced_by: str | None = None,
        state: dict[str, Any] | None = None,
        patch: list[dict[str, Any]] | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Checkpoint the agent's state (writing `state`, or applying the JSON Patch `patch`, first)."""
        body = drop_none(
            {"reason": reason, "step": step, "produced_by": produced_by, "state": state, "patch": patch}
        )
        return Request("POST", f"/agents/{agent}/checkpoints", json=body, idempotency_key=idempotency_key)

    @operation
    def checkpoints_list(agent: str, *, cursor: str | None = None, limit: int | None = None) -> Request[Page]:
        return Request("GET", f"/agents/{agent}/checkpoints", params={"cursor": cursor, "limit": limit})

    @operation
    def checkpoint_get(agent: str, ref: str | int) -> Request[dict[str, Any]]:
        """One checkpoint by seq or id, with the state it recorded."""
        return Request("GET", f"/agents/{agent}/checkpoints/{ref}")

    @operation
    def checkpoint_diff(agent: str, source: str | int, target: str | int) -> Request[dict[str, Any]]:
        """What changed between two checkpoints, one entry per JSON path."""
        return Request(
            "GET", f"/agents/{agent}/checkpoints/diff", params={"from": str(source), "to": str(target)}
        )

    @operation
    def blob_put(agent: str, sha256: str, data: bytes) -> Request[dict[str, Any]]:
        """Keep `data` beside the agent's checkpoints and events, under its SHA-256 (hex): a
        checkpoint or event then carries the digest, not the bytes. The same bytes again: 200."""
        body = {"base64": base64.b64encode(data).decode()}
        return Request("PUT", f"/agents/{agent}/blobs/{sha256}", json=body)

    @operation
    def blob_get(agent: str, sha256: str) -> Request[bytes]:
        """The bytes of the agent's blob with this SHA-256."""
        return Request(
            "GET", f"/agents/{agent}/blobs/{sha256}", parse=lambda body: base64.b64decode(body["base64"])
        )

    @operation
    def recovered_state(agent: str, *, as_agent: str | None = None) -> Request[dict[str, Any]]:
        """Everything to resume after a crash; private context and inbox only with as_agent=agent."""
        return Request("GET", f"/agents/{agent}/recovered-state", params={"as_agent": as_agent})

    @operation
    def reducers_get(agent: str) -> Request[dict[str, Any]]:
        return Request("GET", f"/agents/{agent}/reducers")

    @operation
    def reducers_put(
        agent: str, reducers: list[dict[str, str]], *, idempotency_key: str | None = None
    ) -> Request[dict[str, Any]]:
        """Declare how `agent.*` events fold: [{event_type, op: set|merge|append, target, source}]."""
        return Request(
            "PUT", f"/agents/{agent}/reducers", json={"reducers": reducers}, idempotency_key=idempotency_key
        )

    @operation
    def context_view(agent: str, task: str) -> Request[dict[str, Any]]:
        """The agent's view of a task: shared context, its private context, its inbox."""
        return Request("GET", f"/agents/{agent}/context-view", params={"task": task, "as_agent": agent})

    @operation
    def shared_context_get(task: str) -> Request[dict[str, Any]]:
        return Request("GET", f"/tasks/{task}/shared-context")

    @operation
    def shared_context_put(
        task: str,
        *,
        as_agent: str | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Request[dict[str, Any]]:
        """Replace the shared context (fields: goal, constraints, artifacts, decisions, dependencies)."""
        return Request(
            "PUT",
            f"/tasks/{task}/shared-context",
            json=fields,
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    @operation
    def shared_context_patch(
        task: str,
        *,
        as_agent: str | None = None,
        append: dict[str, list[Any]] | None = None,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Request[dict[str, Any]]:
        """Change some shared-context fields, and/or append items to its lists."""
        body = drop_none({**fields, "append": append})
        return Request(
            "PATCH",
            f"/tasks/{task}/shared-context",
            json=body,
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    @operation
    def private_context_get(task: str, *, as_agent: str) -> Request[dict[str, Any]]:
        return Request("GET", f"/tasks/{task}/private-context", params={"as_agent": as_agent})

    @operation
    def private_context_put(
        task: str,
        data: dict[str, Any],
        *,
        as_agent: str,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        return Request(
            "PUT",
            f"/tasks/{task}/private-context",
            json={"data": data},
            params={"as_agent": as_agent, "expected_version": expected_version},
            idempotency_key=idempotency_key,
        )

    @operation
    def task_message_send(
        task: str,
        body: Any,
        *,
        as_agent: str,
        to: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Send a message on the task to `to` (None = broadcast)."""
        return Request(
            "POST",
            f"/tasks/{task}/messages",
            json={"to": to, "body": body},
            params={"as_agent": as_agent},
            idempotency_key=idempotency_key,
        )

    @operation
    def task_messages_list(
        task: str,
        *,
        as_agent: str,
        box: str | None = None,
        unread: bool | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Request[Page]:
        params = {"as_agent": as_agent, "box": box, "unread": unread, "cursor": cursor, "limit": limit}
        return Request("GET", f"/tasks/{task}/messages", params=params)

    @operation
    def task_messages_mark_read(
        task: str, *, as_agent: str, ids: list[str] | None = None, idempotency_key: str | None = None
    ) -> Request[dict[str, Any]]:
        return Request(
            "POST",
            f"/tasks/{task}/messages/read",
            json={"ids": ids},
            params={"as_agent": as_agent},
            idempotency_key=idempotency_key,
        )

    # --- decay ---
    @operation
    def fact_register(
        session_id: str,
        *,
        key: str,
        type: str,
        content: str,
        scope: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Track a fact of the session (or update the one with this key). Importance comes from `type`."""
        body = drop_none({"key": key, "type": type, "content": content, "scope": scope})
        return Request("POST", f"/sessions/{session_id}/facts", json=body, idempotency_key=idempotency_key)

    @operation
    def facts_list(
        session_id: str,
        *,
        decayed: bool | None = None,
        importance: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Request[dict[str, Any]]:
        """The session's facts with their decay state, most urgent first.

        Returns `{session, round, items, next_cursor}`."""
        params = {
            "decayed": None if decayed is None else str(decayed).lower(),
            "importance": importance,
            "cursor": cursor,
            "limit": limit,
        }
        return Request("GET", f"/sessions/{session_id}/facts", params=params)

    @operation
    def decay_report(session_id: str) -> Request[dict[str, Any]]:
        """The decayed facts with a recommendation each (restate_now / consider_restating / no_action)."""
        return KnowledgeOps.facts_list.build(session_id, decayed=True)

    @operation
    def fact_get(session_id: str, fact_id: str) -> Request[dict[str, Any]]:
        return Request("GET", f"/sessions/{session_id}/facts/{fact_id}")

    @operation
    def fact_reference(
        session_id: str, fact_id: str, *, note: str | None = None, idempotency_key: str | None = None
    ) -> Request[dict[str, Any]]:
        """Mark a fact referenced in the current round (clears its decay)."""
        return Request(
            "POST",
            f"/sessions/{session_id}/facts/{fact_id}/reference",
            json=drop_none({"note": note}),
            idempotency_key=idempotency_key,
        )

    @operation
    def fact_delete(session_id: str, fact_id: str, *, idempotency_key: str | None = None) -> Request[None]:
        return Request("DELETE", f"/sessions/{session_id}/facts/{fact_id}", idempotency_key=idempotency_key)

    @operation
    def session_compress(
        session_id: str,
        *,
        target_ratio: float | None = None,
        up_to_seq: int | None = None,
        recent_messages: int | None = None,
        allow_truncation: bool | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """The history compressed by priority (messages are not changed): `{ratio, messages, dropped, …}`."""
        body = drop_none(
            {"target_ratio": target_ratio, "up_to_seq": up_to_seq, "recent_messages": recent_messages,
             "allow_truncation": allow_truncation}
        )  # fmt: skip
        return Request("POST", f"/sessions/{session_id}/compress", json=body, idempotency_key=idempotency_key)
