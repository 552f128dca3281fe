"""The import structure holds: declared layers, and no import cycle hidden inside a function.

- Each contract in pyproject.toml ([tool.importlinter]) is kept: recovery → layers → cognition →
  fold; tasks → distillation → experiences → the jobs facade; tasks → context → digest →
  summarise → the jobs facade; models, selectors and services never import tasks, api or
  dashboard. import-linter counts imports inside functions too, so a broken contract names the
  offending import wherever it is.
- Every import inside a function in ctxapp/, memory/ and dashboard/ (migrations aside) says why
  it is there, with a trailing `# lazy: <reason>` (docs/architecture.md, "Imports").
- None of those imports is part of an import cycle: moving shared code down a layer is the fix,
  never an import inside a function.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
PACKAGES = ("ctxapp", "memory", "dashboard")
LAZY_REASONS = ("django-setup", "optional-dependency", "startup-cost")
LAZY_COMMENT = re.compile(r"#\s*lazy:\s*(?P<reason>[\w-]+)[^#]*$")

CONTRACTS = [c["id"] for c in tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]]


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_is_kept(contract: str) -> None:
    assert lint_imports(config_filename=str(PYPROJECT), limit_to_contracts=(contract,), no_cache=True) == 0, (
        f"import-linter contract {contract!r} is broken: the offending imports are printed above"
    )


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _function_imports() -> Iterator[tuple[Path, str, ast.Import | ast.ImportFrom]]:
    """(file, its module, import node) for every import inside a function or method."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            seen: set[int] = set()
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in seen:
                        seen.add(id(node))
                        yield path, _module_name(path), node


def _lazy_reason(lines: list[str], node: ast.stmt) -> str | None:
    # A parenthesised import may carry the comment on its first line or its last.
    for lineno in {node.lineno, node.end_lineno or node.lineno}:
        match = LAZY_COMMENT.search(lines[lineno - 1])
        if match:
            return match["reason"]
    return None


def test_every_import_inside_a_function_says_why() -> None:
    unexplained = []
    sources: dict[Path, list[str]] = {}
    for path, _, node in _function_imports():
        lines = sources.setdefault(path, path.read_text().splitlines())
        if _lazy_reason(lines, node) not in LAZY_REASONS:
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            unexplained.append(f"{where}: {lines[node.lineno - 1].strip()}")
    assert not unexplained, (
        "Imports inside functions without `# lazy: <reason>` (reason: one of "
        f"{', '.join(LAZY_REASONS)}); move them to the module top, or move shared code down a "
        "layer if that makes a cycle:\n" + "\n".join(unexplained)
    )


def _imported_modules(node: ast.Import | ast.ImportFrom, path: Path, graph: grimp.ImportGraph) -> set[str]:
    """Our own modules `node` imports (for `from x import y`: x.y when y is a module, else x)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: from the file's package, up `level - 1` packages
            package = _module_name(path.parent / "__init__.py").split(".")
            base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in graph.modules else base
            for alias in node.names
        ]
    found = set()
    for name in names:
        while name and name not in graph.modules:  # `import a.b.c` of a non-module attribute
            name = name.rpartition(".")[0]
        if name.split(".")[0] in PACKAGES:
            found.add(name)
    return found


def test_no_import_inside_a_function_is_part_of_a_cycle() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # every import, function-level ones included
    cycles = []
    for path, module, node in _function_imports():
        for imported in _imported_modules(node, path, graph):
            back = (
                None if imported == module else graph.find_shortest_chain(importer=imported, imported=module)
            )
            if back:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                cycles.append(f"{where}: {module} -> {imported}, and back: {' -> '.join(back)}")
    assert not cycles, (
        "Imports inside functions that close an import cycle (move the shared code down a "
        "layer, or enqueue through memory/services/jobs.py by task name):\n" + "\n".join(cycles)
    )
