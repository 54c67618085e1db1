"""Three small scenarios' whole JSON output, compared byte for byte with tests/golden/.

A failure shows what moved; when the change is intended, regenerate with
``python tests/golden_cases.py --update`` and commit the diff (tests/golden_cases.py).
"""

from __future__ import annotations

import json

import pytest

from golden_cases import CASES, GOLDEN, run_case


@pytest.mark.parametrize("name", list(CASES))
def test_output_equals_the_golden_file(name):
    expected = (GOLDEN / f"{name}.json").read_text(encoding="utf-8")
    actual = run_case(CASES[name])
    if actual != expected:
        moved = _first_difference(json.loads(expected), json.loads(actual))
        pytest.fail(f"{name}: output differs from tests/golden/{name}.json at {moved}; if "
                    "intended, run `python tests/golden_cases.py --update`")


def _first_difference(expected, actual, path="$"):
    """The JSON path of the first value that differs, with both values."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if expected.get(key) != actual.get(key):
                return _first_difference(expected.get(key), actual.get(key), f"{path}.{key}")
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for index, (a, b) in enumerate(zip(expected, actual)):
            if a != b:
                return _first_difference(a, b, f"{path}[{index}]")
    return f"{path}: {expected!r:.80} -> {actual!r:.80}"
