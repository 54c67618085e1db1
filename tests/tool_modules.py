"""The scripts of ``tools/`` as modules, for the tests that check what they compute.

``tools/`` is not a package (its scripts run from the repository root), so a test loads a
script by its file: :func:`load_tool` imports it once and keeps it in ``sys.modules``
under its own name, without adding ``tools/`` to ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    """The module of ``tools/<name>.py`` (imported on first use).

    Raises:
        ValueError: no such script in ``tools/``.
    """
    if name in sys.modules:
        return sys.modules[name]
    path = TOOLS / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"name: {name!r} is not a script in {TOOLS}; valid: "
                         f"{', '.join(sorted(p.stem for p in TOOLS.glob('*.py')))}")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
