"""The executed copies of the notebooks (notebooks/executed/, written by
notebooks/render.py) are what the notebooks are now: the same code cells, every output,
figures as images a repository browser shows, and small enough to keep in git."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

HERE = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(HERE.glob("*.ipynb"))


def _code(book) -> list[str]:
    return [cell.source for cell in book.cells if cell.cell_type == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executed_copy_matches_the_notebook(path):
    copy = HERE / "executed" / path.name
    assert copy.exists(), f"run: python notebooks/render.py {path.relative_to(HERE.parent)}"
    source, executed = nbformat.read(path, as_version=4), nbformat.read(copy, as_version=4)
    assert _code(executed) == _code(source), \
        f"{copy.name} is stale: run python notebooks/render.py {path.name}"
    assert [c.source for c in executed.cells if c.cell_type == "markdown"] == \
        [c.source for c in source.cells if c.cell_type == "markdown"]
    outputs = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "Conclusion:" in printed and "Traceback" not in printed
    assert not any(o.output_type == "error" for o in outputs)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    code = "".join(_code(source))
    if "plotly" in code or "figures." in code:
        assert images, f"{copy.name} has no figure images"
    # no interactive plotly payloads: they are large and repository browsers drop them
    assert not any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in outputs)
    assert copy.stat().st_size < 400_000, copy.stat().st_size


def test_the_explanations_are_on_the_page():
    """Notebook 3's bubble at 64 micro-batches and notebook 4's gap with the same
    all-to-all are explained by what the simulation printed."""
    for name, words in (("03_pipeline_schedules_bubble_memory", ("Explanation:", "LM head",
                                                                 "sum + (m-1) x max")),
                        ("04_nvl8_vs_nvl72_moe", ("Explanation:", "DP gradient reduction",
                                                  "exposed all-to-all"))):
        book = nbformat.read(HERE / "executed" / f"{name}.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code"
                          for o in c.outputs)
        assert all(w in printed for w in words), (name, printed[-800:])
