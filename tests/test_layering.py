"""Design rules of DESIGN.md, pinned: who may import whom, and no torch outside validate."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware", "strategies", "sim", "validate")
# Each package may import itself and the packages listed here (top level only).
ALLOWED = {
    "hardware": set(),
    "strategies": {"hardware"},
    "sim": {"hardware", "strategies"},
    "validate": {"hardware", "strategies", "sim"},
}


def _imports(path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    """Modules a file imports (first dotted component), with line numbers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_lower_layers(package):
    for path in _files(package):
        for module, line in _imports(path, top_level_only=False):
            if module in PACKAGES and module != package:
                # The CLI may reach validate, but only inside its commands.
                inside_function = (package == "sim" and module == "validate"
                                   and (module, line) not in _imports(path, top_level_only=True))
                assert module in ALLOWED[package] or inside_function, \
                    f"{path.relative_to(ROOT)}:{line} imports {module}"


def test_only_validate_imports_torch():
    for package in ("hardware", "strategies", "sim"):
        for path in _files(package):
            for module, line in _imports(path, top_level_only=False):
                assert module != "torch", f"{path.relative_to(ROOT)}:{line} imports torch"


def test_simulator_runs_without_loading_torch():
    code = ("import sys, sim.cli, sim.api, sim.engine, hardware.network, hardware.compute, "
            "strategies.collectives.planner, validate; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
