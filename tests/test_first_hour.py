"""The README's first hour: the commands the README and the banner print run as printed, and
`ctxapp demo` finds the running server (CTXAPP_URL, the `up` of this data directory, CTXAPP_PORT)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ctxapp import cli
from ctxapp.cli import up
from ctxapp.conf import CtxappSettings
from tests.dashboard.live_server import free_port

REPO = Path(__file__).resolve().parents[1]


def banner(tmp_path: Path, first_run: object, capsys: pytest.CaptureFixture[str]) -> str:
    report = {"checks": {"database": {"ok": True, "pgvector": "0.8"}}}
    cfg = dataclasses.replace(CtxappSettings(), host="127.0.0.1", allowed_hosts=["localhost"])
    up._print_banner("http://127.0.0.1:8123", report, first_run, tmp_path, cfg)
    return capsys.readouterr().out


def run_printed(command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    env = dict(os.environ)
    while argv and "=" in argv[0]:  # a leading VAR=value, as a shell would take it
        name, _, value = argv.pop(0).partition("=")
        env[name] = value
    return subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=120, env=env)


def test_the_banner_prints_commands_that_run_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    first = SimpleNamespace(username="admin", password="pw", api_key="ctx_abcd1234_secret")
    out = banner(tmp_path, first, capsys)
    demo = re.search(r"see it move\s+(.+) --api-key ctx_abcd1234_secret", out)
    assert demo, out
    shown = run_printed(demo[1], "--help")
    assert shown.returncode == 0, shown.stderr
    assert "--url" in shown.stdout and "CTXAPP_PORT" in shown.stdout

    rerun = banner(tmp_path, None, capsys)
    new_key = re.search(r"new API key\s+(.+)", rerun)
    assert new_key and new_key[1].endswith(" manage create_api_key --tenant demo"), rerun
    shown = run_printed(new_key[1].removesuffix(" create_api_key --tenant demo"), "help", "create_api_key")
    assert shown.returncode == 0, shown.stderr
    assert "--tenant" in shown.stdout


def test_the_command_name_is_the_scripts_path_when_ctxapp_is_not_on_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    name = cli.command_name()
    assert name == str(Path(sys.executable).parent / "ctxapp") and Path(name).exists()
    venv = Path(sys.executable).parent.parent
    monkeypatch.chdir(venv.parent)  # where the README's install ran
    assert (
        cli.command_name() == f"./{venv.name}/bin/ctxapp" or cli.command_name() == f"{venv.name}/bin/ctxapp"
    )
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")
    assert cli.command_name() == "ctxapp"


def test_the_readme_commands_use_the_venv_script() -> None:
    readme = (REPO / "README.md").read_text()
    install = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/ctxapp up"
    assert install in readme
    # commands with arguments (what a reader copies); a bare `ctxapp demo` in prose names the command
    runnable = re.findall(r"`((?:\.venv/bin/)?ctxapp (?:demo|manage|ctx|mcp) [^`]+)`", readme)
    assert runnable, "the README shows no follow-up command"
    assert all(cmd.startswith(".venv/bin/ctxapp ") for cmd in runnable), runnable


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(["demo", "--api-key", "ctx_0000dead_notakey", "--pace", "0", *argv])
    return code, capsys.readouterr().err


def test_demo_honours_ctxapp_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    port = free_port()  # nothing listens there
    for name in ("CTXAPP_URL", "CTXAPP_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CTXAPP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CTXAPP_PORT", str(port))
    monkeypatch.setenv("HOME", str(tmp_path))
    code, err = demo(capsys)
    assert code == 2 and f"cannot reach http://127.0.0.1:{port}" in err


def test_demo_finds_the_server_up_is_running(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    port = free_port()
    for name in ("CTXAPP_URL", "CTXAPP_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    fallback = free_port()
    monkeypatch.setenv("CTXAPP_PORT", str(fallback))
    monkeypatch.setenv("CTXAPP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid()}))
    code, err = demo(capsys)
    assert code == 2 and f"cannot reach http://127.0.0.1:{port}" in err
    # a file left by an `up` that was killed is ignored
    (tmp_path / "server.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": 2**22 + 7}))
    code, err = demo(capsys)
    assert f"cannot reach http://127.0.0.1:{fallback}" in err
    monkeypatch.setenv("CTXAPP_URL", f"http://127.0.0.1:{port}/")  # the environment wins
    code, err = demo(capsys)
    assert f"cannot reach http://127.0.0.1:{port}" in err


def test_cli_hints_name_the_command_as_the_user_invoked_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    venv = Path(sys.executable).parent.parent
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # ctxapp is not on the PATH: the script's path is
    monkeypatch.chdir(venv.parent)  # where the README's install ran
    for name in ("CTXAPP_URL", "CTXAPP_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CTXAPP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CTXAPP_PORT", str(free_port()))  # nothing listens there
    monkeypatch.setenv("HOME", str(tmp_path))
    invoked = cli.command_name()
    assert invoked.endswith(f"{venv.name}/bin/ctxapp"), invoked
    assert cli.main(["ctx", "decay", "sess_x"]) == 2
    err = capsys.readouterr().err
    assert f"`{invoked} manage create_api_key --tenant demo`" in err, err
    assert cli.main(["ctx", "decay", "sess_x", "--api-key", "ctx_0000dead_notakey"]) == 3
    err = capsys.readouterr().err
    assert f"Is `{invoked} up` running?" in err, err
    code, err = demo(capsys)
    assert code == 2 and f"Is `{invoked} up` running?" in err, err
