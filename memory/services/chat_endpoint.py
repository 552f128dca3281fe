"""The summariser's chat endpoint (CTXAPP_SUMMARISER_*): an OpenAI-compatible
`POST {url}/chat/completions`, tried 1 + CTXAPP_SUMMARISER_RETRIES times, the model shown its own
malformed reply before the next try. Used where a structured answer is asked for (the session
digest, LLM-summary distillation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx
from django.conf import settings

T = TypeVar("T")


def chat_parsed(chat: list[dict[str, str]], parse: Callable[[str], T]) -> tuple[T | None, list[str]]:
    """Send `chat` and return (`parse` of the first usable reply, the errors of the tries before it);
    (None, every try's error) when none was usable. A reply `parse` refuses (ValueError) is shown
    back to the model with the reason; a failed request is simply tried again. Never raises for
    the endpoint."""
    conf = settings.CTXAPP
    headers = {"Authorization": f"Bearer {conf.summariser_api_key}"} if conf.summariser_api_key else {}
    url = conf.summariser_url.rstrip("/") + "/chat/completions"
    errors: list[str] = []
    for _ in range(1 + max(0, conf.summariser_retries)):
        try:
            response = httpx.post(
                url,
                json={"model": conf.summariser_model, "messages": chat, "temperature": 0},
                headers=headers,
                timeout=conf.summariser_timeout,
            )
            response.raise_for_status()
            reply = str(response.json()["choices"][0]["message"]["content"] or "")
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            errors.append(f"request: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        try:
            return parse(reply), errors
        except ValueError as exc:
            errors.append(f"malformed output: {exc}")
            chat = [
                *chat,
                {"role": "assistant", "content": reply[:2000]},
                {
                    "role": "user",
                    "content": f"That reply was not valid ({exc}). Reply with the JSON object only.",
                },
            ]
    return None, errors
