"""Inputs that answered 500 or disagreed with the schema: usage token counts past a PostgreSQL integer
answer 422; sending a task message is documented as the 201 it answers."""

from __future__ import annotations

import pytest

from memory.services.sessions import session_create


@pytest.mark.django_db
@pytest.mark.parametrize(
    "field",
    [
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.reasoning.output_tokens",
    ],
)
def test_token_count_past_int32_is_refused(api_a, tenant_a, field: str) -> None:
    session = session_create(tenant=tenant_a, agent_external_id="bot", model_name="gpt-4o")
    body = {"gen_ai.usage.input_tokens": 10, field: 2**31}
    response = api_a.post(f"/api/v1/sessions/{session.public_id}/usage", body, format="json")
    assert response.status_code == 422, response.content
    assert field in response.json()["error"]["details"]["fields"]


def test_schema_says_task_message_send_answers_201() -> None:
    """The view answers 201; the published schema must say so too."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    responses = schema["paths"]["/api/v1/tasks/{task_id}/messages"]["post"]["responses"]
    assert set(responses) >= {"201"} and "200" not in responses
