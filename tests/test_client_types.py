"""The client's TypedDicts say what the API really answers: each one has exactly the properties of
the OpenAPI component that the operation's path answers with (drf-spectacular, generated in
process), nested shapes included. A field added to or dropped from a serializer fails here until
the client's type follows (ctxapp/client/types.py)."""

from __future__ import annotations

import re
import typing
from typing import Any, get_args, get_origin, is_typeddict

import pytest
from drf_spectacular.generators import SchemaGenerator

from ctxapp import client as ctx
from ctxapp.client import Client
from ctxapp.client._core import API_PREFIX, Request, operation
from tests.helpers import in_process_transport

# (client method, its arguments, the TypedDict that documents its answer)
OPERATIONS: list[tuple[str, tuple[Any, ...], dict[str, Any], Any]] = [
    ("session_create", ("bot",), {}, ctx.SessionOut),
    ("session_get", ("S1",), {}, ctx.SessionOut),
    ("session_end", ("S1",), {}, ctx.SessionOut),
    ("agent_latest_session", ("bot",), {}, ctx.SessionOut),
    ("agents_list", (), {}, ctx.Page),
    ("agent_get", ("bot",), {}, ctx.AgentOut),
    ("sessions_list", (), {}, ctx.Page),
    ("message_append", ("S1",), {"role": "user", "content": "hi"}, ctx.MessageOut),
    ("messages_append", ("S1", [{"role": "user", "content": "hi"}]), {}, ctx.AppendOut),
    ("messages_list", ("S1",), {}, ctx.MessagePage),
    ("memory_search", ("invoice",), {}, ctx.MemorySearchOut),
    ("tasks_list", (), {}, ctx.Page),
    ("task_create", (), {"title": "t"}, ctx.TaskOut),
    ("task_get", ("T1",), {}, ctx.TaskOut),
    ("task_update", ("T1",), {"status": "succeeded"}, ctx.TaskOut),
    ("events_list", ("bot",), {}, ctx.EventPage),
    ("event_emit", ("bot", "agent.note"), {}, ctx.EventOut),
    ("session_digest", ("S1",), {}, ctx.DigestOut),
    ("session_digests", ("S1",), {}, ctx.DigestPage),
    ("experience_get", ("E1",), {}, ctx.ExperienceDetailOut),
    ("experience_feedback", ("E1",), {"helpful": True}, ctx.ExperienceDetailOut),
    ("experiences_list", (), {}, ctx.ExperiencePage),
    ("experiences_create_bulk", ([{"problem": "p"}],), {}, ctx.ExperienceBulkOut),
    ("experience_policy_get", (), {}, ctx.ExperiencePolicyOut),
    ("experience_policy_update", (), {"capacity": 10}, ctx.ExperiencePolicyOut),
    ("checkpoint_create", ("bot",), {}, ctx.CheckpointOut),
    ("checkpoint_get", ("bot", 3), {}, ctx.CheckpointOut),
    ("checkpoints_list", ("bot",), {}, ctx.CheckpointPage),
    ("users_forget", ("u1",), {}, ctx.ForgetReceiptOut),
    ("message_redact", ("S1", 3), {}, ctx.RedactReceiptOut),
]


# Typed by the client, but the server's schema declares a free-form object for their answer.
UNDESCRIBED = {"task_messages_list"}


def _request(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Request[Any]:
    """The request `Client.<name>(*args, **kwargs)` sends (built by the sans-IO core, not sent)."""
    return getattr(Client, name).build(*args, **kwargs)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def _answers(schema: dict[str, Any], request: Request[Any]) -> list[str]:
    """The component names the schema's matching operation answers with (2xx)."""
    path = API_PREFIX + request.path
    for template, operations in schema["paths"].items():
        pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path) and request.method.lower() in operations:
            responses = operations[request.method.lower()]["responses"]
            return [
                body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
                for code, body in responses.items()
                if code.startswith("2")
                and "$ref" in body.get("content", {}).get("application/json", {}).get("schema", {})
            ]
    raise AssertionError(f"{request.method} {path} is not in the schema")


def _drift(schema: dict[str, Any], shape: Any, component: str, where: str) -> list[str]:
    """Differences between a TypedDict and a component, recursing into nested shapes."""
    properties = schema["components"]["schemas"][component].get("properties", {})
    keys = set(shape.__required_keys__ | shape.__optional_keys__)
    problems = []
    if keys != set(properties):
        problems.append(
            f"{where}: {shape.__name__} vs {component}: client lacks {sorted(set(properties) - keys)}, "
            f"schema lacks {sorted(keys - set(properties))}"
        )
    hints = typing.get_type_hints(shape)
    for key in keys & set(properties):
        inner, prop = hints[key], properties[key]
        if get_origin(inner) is list:
            inner, prop = get_args(inner)[0], prop.get("items", {})
        if is_typeddict(inner):
            ref = prop.get("$ref") or next((p["$ref"] for p in prop.get("allOf", []) if "$ref" in p), "")
            assert ref, f"{where}.{key}: the schema does not describe {inner.__name__}"
            problems += _drift(schema, inner, ref.rsplit("/", 1)[-1], f"{where}.{key}")
    return problems


def _annotated(name: str) -> Any:
    """The TypedDict `Client.<name>` is annotated to return, or None (e.g. dict[str, Any])."""
    returned = get_args(typing.get_type_hints(getattr(Client, name).build)["return"])[0]
    return returned if is_typeddict(returned) else None


def test_every_typed_answer_has_the_properties_of_its_openapi_component(schema: dict[str, Any]) -> None:
    problems = []
    for name, args, kwargs, documented in OPERATIONS:
        request = _request(name, args, kwargs)
        components = _answers(schema, request)
        assert components, f"{name}: the schema gives no shape for {request.method} {request.path}"
        for shape in {documented, _annotated(name)} - {None}:
            drifts = [_drift(schema, shape, component, name) for component in components]
            if all(drifts):  # none of the 2xx answers has exactly these keys
                problems += drifts[0]
    assert not problems, "\n".join(problems)


def test_the_operations_checked_here_cover_every_typed_answer_of_the_client() -> None:
    typed = {
        name
        for name in dir(Client)
        if isinstance(getattr(Client, name), operation) and name != "request" and _annotated(name)
    }
    assert typed - {name for name, *_ in OPERATIONS} - UNDESCRIBED == set(), "add them to OPERATIONS"


@pytest.mark.django_db
def test_real_answers_have_the_keys_of_the_client_types(alice: Client, api_b: Any) -> None:
    session = alice.session_create("bot", user_id="u-1", model="gpt-4o")
    message = alice.message_append(session["id"], role="user", content="My invoice is wrong.")
    batch = alice.messages_append(session["id"], [{"role": "assistant", "content": "Let me look."}])
    task = alice.task_create(session=session["id"], title="invoice")
    event = alice.event_emit("bot", "agent.note", {"text": "checked"})
    alice.state_put("bot", {"context": {"goal": "fix the invoice"}})
    checkpoint = alice.checkpoint_create("bot", reason="before refund")
    detail = alice.checkpoint_get("bot", checkpoint["seq"])
    answers: list[tuple[Any, Any]] = [
        (session, ctx.SessionOut),
        (alice.session_get(session["id"]), ctx.SessionOut),
        (message, ctx.MessageOut),
        (batch, ctx.AppendOut),
        (batch["messages"][0], ctx.AppendedMessage),
        (alice.messages_list(session["id"])["items"][0], ctx.MessageOut),
        (task, ctx.TaskOut),
        (event, ctx.EventOut),
        (checkpoint, ctx.CheckpointOut),
        (detail, ctx.CheckpointOut),
        (alice.checkpoints_list("bot")["items"][0], ctx.CheckpointOut),
        (alice.memory_search("invoice", scope={"session": session["id"]}), ctx.MemorySearchOut),
    ]
    for answer, shape in answers:
        assert shape.__required_keys__ <= set(answer) <= shape.__required_keys__ | shape.__optional_keys__, (
            shape.__name__,
            sorted(set(answer) ^ (shape.__required_keys__ | shape.__optional_keys__)),
        )
    assert "state" in detail and "state" not in checkpoint

    # Bob (tenant B) gets NotFound for Alice's checkpoint, exactly as for a missing one.
    with (
        in_process_transport() as transport,
        Client("http://testserver", api_b.secret, retries=0, transport=transport) as bob,
    ):
        with pytest.raises(ctx.NotFound):
            bob.checkpoint_get("bot", checkpoint["id"])
        with pytest.raises(ctx.NotFound):
            bob.session_get(session["id"])
