"""`ctxapp manage …`: Django's management commands, on the project's database only."""

from __future__ import annotations

import os

from ctxapp.cli.base import (
    DATA_DIR_NAME,
    CliError,
    command_name,
    data_dir_of,
    django_setup,
    prepare_database,
    settings_load,
)
from ctxapp.conf import CtxappSettings

# Commands that work on a database without ctxapp's schema (or none at all).
SCHEMALESS_COMMANDS = frozenset(
    {"migrate", "makemigrations", "showmigrations", "sqlmigrate", "check", "help", "version", "dbshell"}
)


def _check_database_exists(cfg: CtxappSettings, command: str) -> None:
    """Refuse to start a new, empty embedded database for anything but `migrate`."""
    from ctxapp.infra import embedded  # lazy: startup-cost

    if cfg.database_url or command == "migrate":
        return
    data_dir = data_dir_of(cfg)
    if not embedded.pgdata_dir(data_dir).exists():
        raise CliError(
            f"No ctxapp database in {data_dir}. CTXAPP_DATA_DIR is unset, and neither this directory "
            f"nor one above it has a {DATA_DIR_NAME} directory. Run this from your ctxapp project (where "
            f"you ran `{command_name()} up`), or point at its data: "
            f"CTXAPP_DATA_DIR=/path/to/.ctxapp {command_name()} manage …"
        )


def _check_schema(command: str) -> None:
    """Refuse a command that needs ctxapp's tables on a database that does not have them."""
    if command in SCHEMALESS_COMMANDS:
        return
    django_setup()
    from django.db import DatabaseError, connection  # lazy: django-setup
    from django.db.migrations.recorder import MigrationRecorder  # lazy: django-setup

    try:
        applied = MigrationRecorder(connection).applied_migrations()
    except DatabaseError as exc:
        raise CliError(f"Cannot read the database's migrations: {str(exc).strip()}") from None
    finally:
        connection.close()
    if ("memory", "0001_initial") not in applied:
        name = connection.settings_dict.get("NAME")
        raise CliError(
            f"The database {name!r} has no ctxapp schema yet. Create it first: `{command_name()} manage "
            f"migrate` (or `{command_name()} up`, which migrates), then run this command again."
        )


def cmd_manage(argv: list[str]) -> int:
    cfg = settings_load()
    command = argv[0] if argv else "help"
    if command not in ("help", "--help", "-h"):
        _check_database_exists(cfg, command)
        prepare_database(cfg)
        _check_schema(command)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ctxapp.settings")
    from django.core.management import execute_from_command_line  # lazy: django-setup

    execute_from_command_line(["ctxapp manage", *argv])
    return 0
