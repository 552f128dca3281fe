"""The event log reads like a flight recorder: one sentence per event, the payload on expand."""

from __future__ import annotations

from typing import Any

from django.test import Client

from dashboard.timeline import event_summary, shorten
from memory.models import Tenant
from memory.services import recorder


def test_known_events_read_as_sentences() -> None:
    assert (
        event_summary("message.added", {"seq": 12, "role": "user", "tokens": 43, "event_kind": None})
        == "User message #12, 43 tokens"
    )
    built = {"gen_ai.request.model": "gpt-4o", "prompt_tokens": 900, "input_limit": 8000, "components": {}}
    assert event_summary("context.built", built) == "Context built for gpt-4o: 900 of 8000 tokens"
    assert event_summary("session.created", {"user_id": "u-7"}) == "Session started for user u-7"
    assert event_summary("session.created", {}) == "Session started"


def test_unknown_events_list_their_fields_cut_at_a_word_boundary() -> None:
    error = "the upstream answered with a long explanation of why nothing could be done " * 3
    line = event_summary("backfill.failed", {"error": error, "attempts": 3, "gen_ai.agent.id": "a1"})
    assert line.startswith("error the upstream answered") and "attempts 3" in line
    assert "gen_ai" not in line  # the ids every event carries are noise in a timeline
    value = line.split(" · ")[0].removeprefix("error ")
    assert value.endswith("…") and error.startswith(value[:-1])
    assert value[:-1].split()[-1] in error.split()  # the last word kept is whole


def test_a_sentence_missing_a_field_falls_back_to_the_fields() -> None:
    assert event_summary("checkpoint.created", {"checkpoint": "ckpt_1"}) == "checkpoint ckpt_1"


def test_shorten_leaves_short_text_alone() -> None:
    assert shorten("a  short\ntext") == "a short text"


def test_the_agent_event_log_shows_sentences_with_the_payload_on_expand(
    web_alice: Client, tenant_a: Tenant, session_a: Any
) -> None:
    recorder.event_append(
        tenant=tenant_a,
        type="checkpoint.created",
        agent=session_a.agent,
        payload={"checkpoint": "ckpt_abc", "seq": 4, "reason": "before deploy", "step": 2},
    )
    page = web_alice.get(f"/agents/{session_a.agent.external_id}/").content.decode()
    assert "<summary>Checkpoint #4 (before deploy)</summary>" in page
    assert "&quot;checkpoint&quot;: &quot;ckpt_abc&quot;" in page  # the whole payload, on expand


def test_a_digest_update_reads_as_a_sentence() -> None:
    payload = {"version": 2, "covers_up_to_seq": 76, "method": "offline"}
    assert event_summary("digest.updated", payload) == "Digest version 2 written, up to #76 (offline)"
