"""`ctxapp ctx …` against a live server: each command's table and --json, config sources, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxapp.cli import main
from ctxapp.client import Client
from memory.models import DecayPolicy, Experience, Tenant, TrackedFact
from memory.services.tenancy import api_key_create
from tests.conftest import worker_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tenant(transactional_db: None) -> Tenant:
    tenant = Tenant.objects.create(name="Alice's team", slug="alice")
    DecayPolicy.objects.create(tenant=tenant, decay_rounds=2, decay_rounds_high=2)
    return tenant


@pytest.fixture
def env(
    tenant: Tenant, web_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[dict[str, str]]:
    _, key = api_key_create(tenant=tenant, name="cli")
    monkeypatch.setenv("CTXAPP_URL", web_server)
    monkeypatch.setenv("CTXAPP_API_KEY", key)
    monkeypatch.setenv("CTXAPP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/ctxapp/config.toml of the machine
    yield {"url": web_server, "key": key}


@pytest.fixture
def session(env: dict[str, str]) -> str:
    with Client(env["url"], env["key"]) as client:
        sid = client.session_create("cli-bot", user_id="u-7")["id"]
        client.message_append(sid, role="user", content="We deploy the billing service on Fridays.")
        client.message_append(sid, role="assistant", content="Noted: deploys of billing happen on Fridays.")
        return str(sid)


def ctx(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["ctx", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_register_then_decay_refresh_and_sync(session: str, tenant: Tenant, capsys: Any) -> None:
    code, out, _ = ctx(
        capsys, "register", session, "--type", "constraint", "Never deploy billing during month end"
    )
    assert code == 0 and "Tracked fact" in out and "constraint" in out
    assert (
        TrackedFact.objects.get(session__public_id=session).content == "Never deploy billing during month end"
    )
    code, out, _ = ctx(
        capsys, "register", session, "--type", "preference", "--key", "tone", "Answer tersely", "--json"
    )
    assert code == 0 and json.loads(out)["key"] == "tone"

    code, out, _ = ctx(capsys, "decay", session, "--json")
    assert code == 0 and json.loads(out)["items"] == []  # nothing has decayed yet
    with Client(*_target()) as client:
        client.messages_append(
            session, [{"role": "user", "content": f"Unrelated question {i}"} for i in range(4)]
        )
    code, out, _ = ctx(capsys, "decay", session)
    assert code == 0 and "Decayed facts" in out and "month end" in out and "tone" in out
    report = json.loads(ctx(capsys, "decay", session, "--json")[1])
    assert {f["key"] for f in report["items"]} == {"tone", report["items"][0]["key"]} and len(
        report["items"]
    ) == 2

    code, out, _ = ctx(capsys, "refresh", session, "--append", "--json")
    refreshed = json.loads(out)
    # the constraint is restated; the low-importance preference is left (recommendation no_action)
    constraint = TrackedFact.objects.get(session__public_id=session, fact_type="constraint")
    assert code == 0 and refreshed["restated"] == [constraint.public_id] and "month end" in refreshed["text"]
    still = json.loads(ctx(capsys, "decay", session, "--json")[1])["items"]
    assert [f["key"] for f in still] == ["tone"]
    with Client(*_target()) as client:
        last = client.messages_list(session)["items"][-1]
    assert last["role"] == "system" and "Never deploy billing during month end" in last["content"]

    code, out, _ = ctx(capsys, "sync", session)
    assert code == 0 and "Promoted to long-term memory: 2 of 2 facts" in out
    promoted = Experience.objects.filter(tenant=tenant, kind__in=["constraint", "preference"])
    assert promoted.count() == 2 and {e.user_id for e in promoted} == {"u-7"}


def _target() -> tuple[str, str]:
    import os

    return os.environ["CTXAPP_URL"], os.environ["CTXAPP_API_KEY"]


def test_enhance_check_position_compress_summarize_and_search(session: str, capsys: Any) -> None:
    ctx(capsys, "register", session, "--type", "constraint", "Billing deploys need a change ticket")
    code, out, _ = ctx(capsys, "enhance", session, "When can I deploy billing?")
    assert code == 0 and "prompt tokens" in out and "Recalled and retrieved" in out
    built = json.loads(ctx(capsys, "enhance", session, "When can I deploy billing?", "--json")[1])
    assert "change ticket" in json.dumps(built["messages"])
    # The summary line counts the history turns the prompt holds, as the manifest lists them.
    history = [i for i in built["manifest"]["items"] if i["kind"] == "history" and i["included"]]
    assert history and f", {len(history)} history messages" in out
    # memory search over this session and the user's others: the Friday turn about billing deploys
    assert any(h["kind"] == "message" and "billing" in h["text"] for h in built["memory_search"])
    assert "Memory search for this query" in out

    code, out, _ = ctx(capsys, "check-position", session, "--json")
    position = json.loads(out)
    assert code == 0 and position["build_id"] == built["build_id"]
    assert {item["kind"] for item in position["critical"]} >= {"pinned_fact", "input"}
    assert all(item["where"] in {"start", "end", "MIDDLE"} for item in position["critical"])

    code, out, _ = ctx(capsys, "compress", session, "--ratio", "0.3", "--json")
    compressed = json.loads(out)
    assert code == 0 and compressed["target_ratio"] == 0.3 and compressed["tokens_before"] > 0
    code, out, _ = ctx(capsys, "compress", session, "--ratio", "0.3")
    assert "History by priority" in out

    code, out, _ = ctx(capsys, "summarize", session, "--json")
    assert code == 0 and json.loads(out)["queued"] is True

    with Client(*_target()) as client:
        client.experience_create("Billing deploy blocked by missing ticket", solution="open a change ticket")
    code, out, _ = ctx(capsys, "search", "billing ticket")
    assert code == 0 and "Billing deploy blocked" in out
    found = json.loads(ctx(capsys, "search", "billing ticket", "--json")[1])
    assert any(h["kind"] == "experience" and "Billing deploy blocked" in h["text"] for h in found["results"])


def test_search_finds_a_turn_of_an_earlier_session_and_narrows_by_scope(session: str, capsys: Any) -> None:
    with Client(*_target()) as client:
        later = client.session_create("cli-bot", user_id="u-7")["id"]
        client.message_append(later, role="user", content="Remind me of our deploy day?")
        other = client.session_create("cli-bot", user_id="u-9")["id"]
        client.message_append(other, role="user", content="Billing deploys for u-9 are on Mondays.")
    code, out, _ = ctx(capsys, "search", "which day do we deploy billing", "--session", later)
    assert code == 0 and "Fridays" in out and "Memory search" in out
    found = json.loads(
        ctx(capsys, "search", "which day do we deploy billing", "--session", later, "--kind", "message",
            "--json")[1]
    )  # fmt: skip
    hits = found["results"]
    fridays = [h for h in hits if "Fridays" in h["text"]]
    assert fridays and {h["session"] for h in fridays} == {session}  # said in the earlier session
    assert {h["kind"] for h in hits} == {"message"}
    assert not any("Mondays" in h["text"] for h in hits)  # another user's session is outside the scope
    current = json.loads(
        ctx(capsys, "search", "deploy billing", "--session", later, "--current", "--json")[1]
    )["results"]
    assert current and {h["session"] for h in current if h["kind"] == "message"} == {later}
    users = json.loads(ctx(capsys, "search", "deploy billing", "--user-id", "u-9", "--json")[1])["results"]
    assert [h["text"] for h in users if h["kind"] == "message"] == ["Billing deploys for u-9 are on Mondays."]
    code, _, err = ctx(capsys, "search", "billing", "--session", "ses_nope")
    assert code == 4 and "not found" in err
    code, _, err = ctx(capsys, "search", "billing", "--current")
    assert code == 2 and "--current needs --session" in err


def test_config_file_supplies_url_and_key(
    env: dict[str, str], session: str, capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CTXAPP_URL")
    monkeypatch.delenv("CTXAPP_API_KEY")
    config = tmp_path / "ctx.toml"
    config.write_text(f'url = "{env["url"]}"\napi_key = "{env["key"]}"\n')
    code, out, err = ctx(capsys, "decay", session, "--config", str(config), "--json")
    assert code == 0, err
    assert json.loads(out)["session"] == session
    default = tmp_path / ".config" / "ctxapp" / "config.toml"  # HOME is tmp_path
    default.parent.mkdir(parents=True)
    default.write_text(config.read_text())
    assert ctx(capsys, "decay", session, "--json")[0] == 0


def test_errors_are_clear_without_a_traceback(
    env: dict[str, str], capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = ctx(capsys, "decay", "ses_missing")
    assert code == 4 and "not found" in err and "Traceback" not in err
    code, _, err = ctx(capsys, "decay", "ses_missing", "--api-key", "ctx_00000000_wrong")
    assert code == 2 and "refused the API key" in err
    code, _, err = ctx(capsys, "decay", "ses_missing", "--url", "http://127.0.0.1:9")
    assert code == 3 and "cannot reach ctxapp at http://127.0.0.1:9" in err
    monkeypatch.delenv("CTXAPP_API_KEY")
    result = subprocess.run(
        [sys.executable, "-m", "ctxapp.cli", "ctx", "decay", "ses_x"], capture_output=True, text=True,
        env={**worker_env(), "CTXAPP_URL": env["url"], "HOME": "/nonexistent"}, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "No API key" in result.stderr and "Traceback" not in result.stderr


def test_another_tenants_session_is_not_found(
    env: dict[str, str], session: str, capsys: Any, transactional_db: None
) -> None:
    bob = Tenant.objects.create(name="Bob's team", slug="bob")
    _, bob_key = api_key_create(tenant=bob, name="cli")
    for command in (
        ["decay", session],
        ["enhance", session, "q"],
        ["register", session, "x"],
        ["sync", session],
    ):
        code, _, err = ctx(capsys, *command, "--api-key", bob_key)
        assert code == 4 and "not found" in err, command
    assert not TrackedFact.objects.filter(content="x").exists()
    code, out, _ = ctx(capsys, "search", "billing", "--api-key", bob_key, "--json")
    assert code == 0 and json.loads(out)["results"] == []
