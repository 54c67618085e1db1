"""Design rules of DESIGN.md, pinned: who may import whom, and no torch outside validate."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hardware", "strategies", "sim", "validate", "trainsim")
# Each package may import itself and the packages listed here (anywhere in a file).
ALLOWED = {
    "hardware": set(),
    "strategies": {"hardware"},
    "sim": {"hardware", "strategies"},
    "validate": {"hardware", "strategies", "sim"},
    "trainsim": {"hardware", "strategies", "sim"},
}
#: validate, for trainsim, only inside the functions of this folder (the commands).
VALIDATE_COMMANDS = ROOT / "trainsim" / "cli"


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


def _imports_inside_functions(path: Path) -> set[int]:
    """Line numbers of the imports that sit inside a function body."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = set()
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines |= {node.lineno for node in ast.walk(func)
                      if isinstance(node, (ast.Import, ast.ImportFrom))}
    return lines


def _files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_lower_layers(package):
    for path in _files(package):
        inside = _imports_inside_functions(path)
        for module, line in _imports(path, top_level_only=False):
            if module in PACKAGES and module != package:
                # The CLI's validate/calibrate commands reach validate, inside functions.
                command = (package == "trainsim" and module == "validate" and line in inside
                           and VALIDATE_COMMANDS in path.parents)
                assert module in ALLOWED[package] or command, \
                    f"{path.relative_to(ROOT)}:{line} imports {module}"


@pytest.mark.parametrize("package", PACKAGES + ("trainsim/cli",))
def test_every_package_says_what_it_is_exports_and_must_not_import(package):
    init = ROOT / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    for words in ("What it is", "export", "import"):
        assert words in doc, f"{init.relative_to(ROOT)}: the docstring does not say {words!r}"


@pytest.mark.parametrize("package", ("hardware", "strategies", "sim"))
def test_lower_packages_import_nothing_at_package_level(package):
    """``import sim`` (etc.) loads none of its modules: they stay import-light."""
    code = (f"import sys; import {package}; "
            f"print(sorted(m for m in sys.modules if m.startswith('{package}.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_only_validate_imports_torch():
    for package in ("hardware", "strategies", "sim", "trainsim"):
        for path in _files(package):
            for module, line in _imports(path, top_level_only=False):
                assert module != "torch", f"{path.relative_to(ROOT)}:{line} imports torch"


def test_simulator_runs_without_loading_torch():
    code = ("import sys, trainsim, trainsim.cli, trainsim.api, sim.engine, hardware.network, "
            "hardware.compute, strategies.collectives.planner, validate; "
            "trainsim.simulate; trainsim.figures; "
            "print('torch' in sys.modules, 'validate.worker' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False False"
