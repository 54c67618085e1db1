"""Design rules of DESIGN.md, pinned: who may import whom, and no torch outside validate."""

from __future__ import annotations

import ast
import functools
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    """A file's syntax tree, parsed once per run: several rules read each file, and
    none of them changes the tree."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a file's tree, in ``ast.walk`` order, listed once per run."""
    return tuple(ast.walk(_tree(path)))


def _imports(path: Path, *, top_level_only: bool) -> list[tuple[str, int]]:
    """Modules a file imports (first dotted component), with line numbers."""
    nodes = _tree(path).body if top_level_only else _nodes(path)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module.split(".")[0], node.lineno))
    return found


def _imports_inside_functions(path: Path) -> set[int]:
    """Line numbers of the imports that sit inside a function body."""
    lines = set()
    for func in _nodes(path):
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
            "hardware.compute, hardware.cost, strategies.collectives.catalog, validate; "
            "trainsim.simulate; trainsim.figures; "
            "print('torch' in sys.modules, 'validate.worker' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False False"


#: The hardware models that turn work into time; the cost model (hardware.cost)
#: composes them and is the only door to them outside hardware/ (validate, which fits
#: them to measurements, reads them too).
PRICING_MODULES = {"hardware.compute", "hardware.network", "hardware.flow"}
#: What strategies may read of hardware: specs, units, the TOML source reader and the
#: input edge (hardware.user_input: user files read and checked; the loaders of models and
#: failure profiles use it).
STRATEGIES_MAY_READ = {"hardware.spec", "hardware.units", "hardware.toml_sources",
                       "hardware.user_input"}


def _dotted_imports(path: Path) -> list[tuple[str, int]]:
    """Full dotted module names a file imports (``from a.b import c`` gives ``a.b``)."""
    found = []
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def _divides_by_a_bandwidth(path: Path) -> list[int]:
    """Lines dividing by a ``*_bytes_per_s`` quantity: bytes turned into seconds."""
    lines = []
    for node in _nodes(path):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            names = [n.attr if isinstance(n, ast.Attribute) else n.id
                     for n in ast.walk(node.right) if isinstance(n, (ast.Attribute, ast.Name))]
            if any(name.endswith("_bytes_per_s") for name in names):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("package", ("strategies", "sim", "trainsim"))
def test_only_the_cost_model_turns_work_into_time(package):
    """DESIGN.md's one owner of time: outside hardware/, durations come from
    hardware.cost.CostModel; nothing imports the compute, network or flow models or
    divides bytes by a bandwidth itself."""
    for path in _files(package):
        for module, line in _dotted_imports(path):
            assert module not in PRICING_MODULES, \
                f"{path.relative_to(ROOT)}:{line} imports {module}; ask hardware.cost instead"
        for line in _divides_by_a_bandwidth(path):
            pytest.fail(f"{path.relative_to(ROOT)}:{line} divides by a bandwidth; "
                        "ask hardware.cost for the time")


def test_strategies_read_only_hardware_specs_and_units():
    for path in _files("strategies"):
        for module, line in _dotted_imports(path):
            if module.split(".")[0] == "hardware":
                assert module in STRATEGIES_MAY_READ, \
                    f"{path.relative_to(ROOT)}:{line} imports {module}"


def _schedule_comparisons(path: Path, names: set[str]) -> list[int]:
    """Lines comparing something called ``schedule`` with a schedule's name
    (``plan.schedule == "zb-h1"``, ``schedule in ("1f1b", ...)``)."""
    lines = []
    for node in _nodes(path):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        literals = {n.value for part in parts for n in ast.walk(part)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        mentions = any((isinstance(n, ast.Attribute) and "schedule" in n.attr)
                       or (isinstance(n, ast.Name) and "sched" in n.id)
                       for part in parts for n in ast.walk(part))
        if mentions and literals & names:
            lines.append(node.lineno)
    return lines


def test_schedules_are_never_special_cased_by_name():
    """Schedules own their shape: outside strategies/schedules no module compares a
    schedule with a schedule's name or places stages by ``stage % pp``; they ask the
    schedule object (a new schedule then needs no other edit)."""
    from strategies.schedules import SCHEDULES

    names = set(SCHEDULES)
    for package in ("sim", "strategies", "trainsim"):
        for path in _files(package):
            if "schedules" in path.parts:
                continue
            for line in _schedule_comparisons(path, names):
                pytest.fail(f"{path.relative_to(ROOT)}:{line} special-cases a schedule by name")
            text = path.read_text()
            assert "% plan.pp" not in text and "% self.plan.pp" not in text, \
                f"{path.relative_to(ROOT)} places stages by stage % pp"
