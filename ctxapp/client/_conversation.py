"""The client's operations on sessions, messages, memory search, tasks, events and the context
engine: each one request builder, written once for both clients (see _core.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ctxapp.client._core import (
    Pages,
    Request,
    after_pages,
    as_dict,
    cursor_pages,
    drop_none,
    field,
    operation,
    paginated,
)
from ctxapp.client.types import (
    AgentOut,
    AppendOut,
    DigestOut,
    DigestPage,
    EventOut,
    EventPage,
    ForgetReceiptOut,
    MemoryScope,
    MemorySearchOut,
    MessageOut,
    MessagePage,
    Page,
    RedactReceiptOut,
    SessionOut,
    TaskOut,
)


class ConversationOps:
    """Request builders (no `self`: `@operation` / `@paginated` bind them to a client, which
    sends what they return). `ConversationOps.name.build(...)` is the `Request` itself, unsent."""

    @operation
    def request(
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Request[Any]:
        """Send one API request; return the decoded JSON body (None for an empty body).

        Writes get an Idempotency-Key (this one, or a new one) that every retry reuses. Retries
        network failures, 429, 5xx and `idempotency_in_progress` up to `retries` times with
        exponential backoff; raises the CtxappError subclass matching the error code.
        """
        return Request(method, path, params=params, json=json, idempotency_key=idempotency_key)

    # --- sessions ---------------------------------------------------------------------------
    @operation
    def session_create(
        agent: str,
        *,
        user_id: str | None = None,
        model: str | None = None,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: int | None = None,
        key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[SessionOut]:
        """Open a session; with `key` (the app's own id, unique per agent) the agent's session
        with that key when it has one (answered 200, unchanged), so the call is idempotent."""
        body = drop_none(
            {
                "agent": agent,
                "key": key,
                "user_id": user_id,
                "model": model,
                "metadata": metadata,
                "ttl_seconds": ttl_seconds,
            }
        )
        return Request("POST", "/sessions", json=body, idempotency_key=idempotency_key)

    @operation
    def session_get(session_id: str) -> Request[SessionOut]:
        return Request("GET", f"/sessions/{session_id}")

    @operation
    def sessions_list(
        *,
        agent: str | None = None,
        user_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Request[Page]:
        params = {"agent": agent, "user_id": user_id, "status": status, "cursor": cursor, "limit": limit}
        return Request("GET", "/sessions", params=params)

    @paginated
    def sessions_iter(**filters: Any) -> Pages[SessionOut]:
        """Every session matching the filters, newest first, following the cursor."""
        return cursor_pages(lambda cursor: ConversationOps.sessions_list.build(cursor=cursor, **filters))

    @operation
    def session_end(session_id: str, *, idempotency_key: str | None = None) -> Request[SessionOut]:
        return Request("POST", f"/sessions/{session_id}/end", idempotency_key=idempotency_key)

    @operation
    def session_delete(session_id: str, *, idempotency_key: str | None = None) -> Request[None]:
        return Request("DELETE", f"/sessions/{session_id}", idempotency_key=idempotency_key)

    @operation
    def users_forget(user_id: str, *, idempotency_key: str | None = None) -> Request[ForgetReceiptOut]:
        """Erase everything of the user in the tenant (admin key); again → zero counts."""
        return Request("DELETE", f"/users/{user_id}", idempotency_key=idempotency_key)

    @operation
    def message_redact(
        session_id: str, seq: int, *, replacement: str | None = None, idempotency_key: str | None = None
    ) -> Request[RedactReceiptOut]:
        """Replace message `seq`'s content (default `[redacted]`) everywhere it was copied."""
        body = drop_none({"replacement": replacement})
        return Request(
            "POST",
            f"/sessions/{session_id}/messages/{seq}/redact",
            json=body,
            idempotency_key=idempotency_key,
        )

    @operation
    def agent_delete(agent: str, *, idempotency_key: str | None = None) -> Request[None]:
        """Delete the agent and everything kept under it (sessions, state, checkpoints, its events)."""
        return Request("DELETE", f"/agents/{agent}", idempotency_key=idempotency_key)

    @operation
    def agents_list(
        *,
        prefix: str | None = None,
        name: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Request[Page]:
        """The tenant's agents, newest first, with session counts and last activity (only those
        whose name starts with `prefix`, or only `name`: an empty page when it does not exist)."""
        params = {"prefix": prefix, "name": name, "cursor": cursor, "limit": limit}
        return Request("GET", "/agents", params=params)

    @operation
    def agent_get(agent: str) -> Request[AgentOut]:
        return Request("GET", f"/agents/{agent}")

    @operation
    def agent_latest_session(agent: str) -> Request[SessionOut]:
        """The agent's most recently created session; NotFound (code `no_session`) when none."""
        return Request("GET", f"/agents/{agent}/latest-session")

    # --- messages ---------------------------------------------------------------------------
    @operation
    def message_append(
        session_id: str,
        *,
        role: str,
        content: str = "",
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Request[MessageOut]:
        """Append one message (fields: turn_id, tool_call_id, tool_calls, event_kind, parent_seq,
        artifact_refs, metadata). Returns it with its seq and token count."""
        body = drop_none({"role": role, "content": content, **fields})
        return Request("POST", f"/sessions/{session_id}/messages", json=body, idempotency_key=idempotency_key)

    @operation
    def messages_append(
        session_id: str, messages: list[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> Request[AppendOut]:
        """Append a batch, all or nothing (the server's limit is CTXAPP_BATCH_MAX_MESSAGES)."""
        return Request(
            "POST",
            f"/sessions/{session_id}/messages",
            json={"messages": messages},
            idempotency_key=idempotency_key,
        )

    @operation
    def messages_list(
        session_id: str, *, after: int | None = None, limit: int | None = None
    ) -> Request[MessagePage]:
        """Messages with seq > after, oldest first; pass `next_after` back for the next page."""
        return Request("GET", f"/sessions/{session_id}/messages", params={"after": after, "limit": limit})

    @paginated
    def messages_iter(session_id: str, *, after: int = 0) -> Pages[MessageOut]:
        """Every message with seq > after, oldest first, page by page."""
        return after_pages(lambda seq: ConversationOps.messages_list.build(session_id, after=seq), after)

    # --- memory search ----------------------------------------------------------------------
    @operation
    def memory_search(
        query: str,
        *,
        scope: MemoryScope | Mapping[str, Any] | None = None,
        kinds: list[str] | None = None,
        limit: int | None = None,
        time_range: Mapping[str, str] | None = None,
        plan: Mapping[str, Any] | None = None,
        neighbours: int | None = None,
    ) -> Request[MemorySearchOut]:
        """Search conversational memory (messages, summaries, facts, experiences) of a scope.

        scope: {agent, user_id, session, sessions: "current" | "all"}; time_range: {from, to} (ISO).
        """
        body = drop_none(
            {"query": query, "scope": as_dict(scope), "kinds": kinds, "limit": limit,
             "time_range": as_dict(time_range), "plan": as_dict(plan), "neighbours": neighbours}
        )  # fmt: skip
        return Request("POST", "/memory/search", json=body)

    @operation
    def memory_index_status() -> Request[dict[str, int]]:
        """The tenant's messages per embedding status: {pending, completed, failed, skipped}."""
        return Request("GET", "/memory/index")

    # --- tasks ------------------------------------------------------------------------------
    @operation
    def task_create(
        *,
        session: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        title: str | None = None,
        input: str | None = None,
        value_tier: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Request[TaskOut]:
        body = drop_none(
            {
                "session": session,
                "agent": agent,
                "user_id": user_id,
                "title": title,
                "input": input,
                "value_tier": value_tier,
                "metadata": metadata,
            }
        )
        return Request("POST", "/tasks", json=body, idempotency_key=idempotency_key)

    @operation
    def tasks_list(
        *,
        session: str | None = None,
        agent: str | None = None,
        user_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> Request[Page]:
        params = {
            "session": session,
            "agent": agent,
            "user_id": user_id,
            "status": status,
            "cursor": cursor,
            "limit": limit,
        }
        return Request("GET", "/tasks", params=params)

    @operation
    def task_get(task_id: str) -> Request[TaskOut]:
        return Request("GET", f"/tasks/{task_id}")

    @operation
    def task_update(
        task_id: str,
        *,
        status: str | None = None,
        output: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Request[TaskOut]:
        body = drop_none({"status": status, "output": output, "metadata": metadata})
        return Request("PATCH", f"/tasks/{task_id}", json=body, idempotency_key=idempotency_key)

    # --- events (flight recorder) -----------------------------------------------------------
    @operation
    def events_list(
        agent: str,
        *,
        after: int | None = None,
        limit: int | None = None,
        type: str | None = None,
        session: str | None = None,
    ) -> Request[EventPage]:
        """The agent's events with seq > after, oldest first; `type` filters (`message.added`, `agent.*`)."""
        return Request(
            "GET",
            f"/agents/{agent}/events",
            params={"after": after, "limit": limit, "type": type, "session": session},
        )

    @paginated
    def events_iter(agent: str, *, after: int = 0, type: str | None = None) -> Pages[EventOut]:
        """Every event of the agent with seq > after (of `type`), oldest first, page by page."""
        return after_pages(lambda seq: ConversationOps.events_list.build(agent, after=seq, type=type), after)

    @operation
    def event_emit(
        agent: str,
        type: str,
        payload: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[EventOut]:
        """Record an agent-emitted event (type must start with `agent.`)."""
        body = drop_none({"type": type, "payload": payload or {}, "session": session})
        return Request("POST", f"/agents/{agent}/events", json=body, idempotency_key=idempotency_key)

    # --- context engine ---
    @operation
    def context_build(
        session_id: str,
        input: str = "",
        *,
        model: str | None = None,
        system_parts: Mapping[str, str] | list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        open_questions: list[str] | None = None,
        next_actions: list[str] | None = None,
        budget: Mapping[str, Any] | None = None,
        mode: str | None = None,
        recall: Mapping[str, Any] | None = None,
        query: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """The next prompt for the session: messages, tools, manifest, budget, warnings, forecast.

        `recall` overrides the recall policy for this build (enabled, top_k, min_score, position,
        budget_share); `query` is what to recall for (default: the input).
        Raises PromptTooLong (its `details` carry the numbers) when even the minimal context does not fit."""
        body = drop_none(
            {
                "input": input,
                "model": model,
                "system_parts": system_parts,
                "tools": tools,
                "open_questions": open_questions,
                "next_actions": next_actions,
                "budget": dict(budget) if budget else None,
                "mode": mode,
                "recall": as_dict(recall),
                "query": query,
            }
        )
        return Request("POST", f"/sessions/{session_id}/context", json=body, idempotency_key=idempotency_key)

    @operation
    def context_builds(session_id: str, *, limit: int | None = None) -> Request[list[dict[str, Any]]]:
        """The session's latest builds (budget samples with their manifests), newest first."""
        return Request(
            "GET", f"/sessions/{session_id}/context", params={"limit": limit}, parse=field("builds")
        )

    @operation
    def usage_report(
        session_id: str,
        *,
        input_tokens: int,
        output_tokens: int | None = None,
        cached_input_tokens: int | None = None,
        reasoning_tokens: int | None = None,
        build_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Request[dict[str, Any]]:
        """Report the provider's usage for a build (default: the latest); calibrates later estimates."""
        body = drop_none(
            {
                "build_id": build_id,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                "gen_ai.usage.cache_read.input_tokens": cached_input_tokens,
                "gen_ai.usage.reasoning.output_tokens": reasoning_tokens,
            }
        )
        return Request("POST", f"/sessions/{session_id}/usage", json=body, idempotency_key=idempotency_key)

    @operation
    def tokens_count(
        *,
        text: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        model: str = "gpt-4o",
    ) -> Request[dict[str, Any]]:
        """Count a text or a chat prompt for a model (exact for OpenAI encodings, else estimated)."""
        body = drop_none({"text": text, "messages": messages, "tools": tools, "model": model})
        return Request("POST", "/tokens/count", json=body)

    @operation
    def models_list(*, provider: str | None = None) -> Request[list[dict[str, Any]]]:
        """Model profiles: built-in and the tenant's own."""
        return Request("GET", "/models", params={"provider": provider}, parse=field("models"))

    @operation
    def model_get(name: str) -> Request[dict[str, Any]]:
        return Request("GET", f"/models/{name}")

    @operation
    def context_policy_get(session_id: str) -> Request[dict[str, Any]]:
        return Request("GET", f"/sessions/{session_id}/context-policy")

    @operation
    def context_policy_set(session_id: str, overrides: Mapping[str, Any]) -> Request[dict[str, Any]]:
        """Replace the session's context policy overrides (history_window, output_reserve, …)."""
        return Request("PUT", f"/sessions/{session_id}/context-policy", json={"overrides": dict(overrides)})

    @operation
    def summaries_list(session_id: str) -> Request[list[dict[str, Any]]]:
        return Request("GET", f"/sessions/{session_id}/summaries", parse=field("summaries"))

    @operation
    def summarise_now(session_id: str) -> Request[dict[str, Any]]:
        """Queue summarisation of the session (202)."""
        return Request("POST", f"/sessions/{session_id}/summaries")

    @operation
    def session_digest(session_id: str, *, version: int | None = None) -> Request[DigestOut]:
        """The session's digest (goals, decisions, findings, preferences, constraints, progress,
        open questions): the latest, or `version`. NotFound while it has none."""
        return Request("GET", f"/sessions/{session_id}/digest", params={"version": version})

    @operation
    def session_digests(
        session_id: str, *, cursor: str | None = None, limit: int | None = None
    ) -> Request[DigestPage]:
        """A page of the session's digest versions, newest first."""
        return Request("GET", f"/sessions/{session_id}/digests", params={"cursor": cursor, "limit": limit})

    @operation
    def session_digest_refresh(session_id: str) -> Request[dict[str, Any]]:
        """Queue an update of the session's digest now (202)."""
        return Request("POST", f"/sessions/{session_id}/digest")
