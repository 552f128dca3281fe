"""The message append records its `message.added` events inside its own statement, and they are
the events the recorder makes: the same row (type, stream, agent, session, payload with its OTel
ids) and the same live update as `recorder.events_append` gives for the same messages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from memory.models import Event, Tenant
from memory.services import broadcast, recorder
from memory.services import messages as message_service
from memory.services import sessions as svc

ROW_FIELDS = ("tenant_id", "type", "stream", "agent_id", "session_id", "payload")


async def _received(channel: str, count: int) -> list[dict[str, Any]]:
    layer = get_channel_layer()
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(20):
        while len(events) < count:
            message = await layer.receive(channel)
            events += [e for e in message["events"] if e["type"] == message_service.MESSAGE_ADDED]
    return events


def _row(event: Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in ROW_FIELDS}


def _listen(tenant: Tenant) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(broadcast.tenant_group(tenant.pk), channel)
    return channel


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("model_name", ["gpt-4o-mini", ""])
def test_an_appends_events_are_the_recorders_own(tenant_a: Tenant, model_name: str) -> None:
    session = svc.session_create(tenant=tenant_a, agent_external_id="bot", model_name=model_name)
    channel = _listen(tenant_a)
    items = [
        svc.MessageInput(role="user", content="What is the weather in Paris?"),
        svc.MessageInput(role="tool", content="18 °C", tool_call_id="call-1", event_kind="tool_result"),
    ]
    appended = svc.messages_append(tenant=tenant_a, session_id=session.public_id, items=items)
    append_rows = list(Event.objects.filter(session=session, type="message.added").order_by("seq"))

    # The same messages through the recorder's ordinary path.
    entries = [(message_service.MESSAGE_ADDED, message_service.message_event_payload(m)) for m in appended]
    with transaction.atomic():
        recorded = recorder.events_append(tenant=tenant_a, entries=entries, session=appended[0].session)
    recorder_rows = list(Event.objects.filter(pk__in=[e.pk for e in recorded]).order_by("seq"))

    assert len(append_rows) == len(recorder_rows) == 2
    for by_append, by_recorder in zip(append_rows, recorder_rows, strict=True):
        assert _row(by_append) == _row(by_recorder)
    # What a reader of the event log sees: the OTel ids, and the message's own fields.
    expected_otel = {"gen_ai.agent.id": "bot", "gen_ai.conversation.id": session.public_id}
    if model_name:
        expected_otel["gen_ai.request.model"] = model_name
    tokens = [m.token_count for m in appended]
    assert [row.payload for row in append_rows] == [
        {**expected_otel, "seq": 1, "role": "user", "tokens": tokens[0], "event_kind": ""},
        {**expected_otel, "seq": 2, "role": "tool", "tokens": tokens[1], "event_kind": "tool_result"},
    ]
    # One stream, gapless: the recorder's events follow the append's.
    assert [row.seq for row in append_rows + recorder_rows] == list(
        range(append_rows[0].seq, append_rows[0].seq + 4)
    )

    # A dashboard receives each event in the recorder's summary of the stored row, both ways.
    live = async_to_sync(_received)(channel, 4)
    assert live == [recorder.event_summary(row) for row in append_rows + recorder_rows]
