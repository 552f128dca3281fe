"""The import layers declared in pyproject.toml ([tool.importlinter]) hold.

recovery → layers → cognition → fold, downwards only: a cycle between them (such as the one that
was once hidden by imports inside functions) breaks this test, naming the offending import.
"""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_service_layers_import_downwards_only() -> None:
    assert lint_imports(config_filename=str(PYPROJECT)) == 0  # the broken contract is printed above
