"""The tests build tables from the models (--nomigrations); production runs the migrations.
They must describe the same schema, or a deploy would miss a column the tests never missed."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_migrations_describe_every_model_change() -> None:
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exit_:
        pytest.fail(f"models changed without a migration (exit {exit_.code}):\n{out.getvalue()}")


@pytest.mark.django_db
def test_each_app_has_one_line_of_migrations() -> None:
    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    conflicts = MigrationLoader(connection, ignore_no_migrations=True).detect_conflicts()
    assert conflicts == {}, f"apps with more than one latest migration (`migrate` would refuse): {conflicts}"
