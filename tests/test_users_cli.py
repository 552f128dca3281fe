"""`ctxapp users …` against a live server: memories (now and --as-of), remember, history and
forget-memory, as tables and --json, and a clear error for an unknown user."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxapp.cli import main
from memory.models import Tenant, UserMemory
from memory.services.sessions import session_create
from memory.services.tenancy import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(
    transactional_db: None, web_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Tenant]:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    session_create(tenant=tenant, agent_external_id="assistant", user_id="u-7")
    _, key = api_key_create(tenant=tenant, name="cli")
    monkeypatch.setenv("CTXAPP_URL", web_server)
    monkeypatch.setenv("CTXAPP_API_KEY", key)
    monkeypatch.setenv("CTXAPP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path))
    yield tenant


def users(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["users", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_remember_list_as_of_history_and_forget(env: Tenant, capsys: Any) -> None:
    code, out, _ = users(
        capsys, "remember", "u-7", "home.city", "Lives in Porto", "--type", "profile", "--json"
    )
    assert code == 0
    first = json.loads(out)
    assert first["outcome"] == "created" and first["type"] == "profile"
    code, out, _ = users(capsys, "remember", "u-7", "home.city", "Moved to Lisbon")
    assert code == 0 and f"superseded (supersedes {first['id']})" in out and "Moved to Lisbon" in out
    second = UserMemory.objects.get(valid_to__isnull=True).public_id

    code, out, _ = users(capsys, "memories", "u-7")
    assert code == 0 and "Memories of u-7" in out and "Moved to Lisbon" in out and "Porto" not in out
    code, out, _ = users(capsys, "memories", "u-7", "--as-of", first["valid_from"], "--json")
    assert code == 0 and [m["text"] for m in json.loads(out)["items"]] == ["Lives in Porto"]

    code, out, _ = users(capsys, "history", second, "--user", "u-7")
    assert code == 0 and out.index("Lives in Porto") < out.index("Moved to Lisbon")
    code, out, _ = users(capsys, "forget-memory", second, "--user", "u-7")
    assert code == 0 and f"Erased 2: {first['id']}, {second}" in out
    assert not UserMemory.objects.exists()

    code, _, err = users(capsys, "memories", "nobody")
    assert code == 4 and err.startswith("ctxapp users: not found: ")
    code, _, err = users(capsys, "remember", "u-7", "pet", "   ")
    assert code == 1 and "validation_error" in err
