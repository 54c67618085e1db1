"""The what-if notebooks execute end to end (their conclusion cells assert what they print)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_six_studies():
    assert len(NOTEBOOKS) == 6


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_and_prints_its_conclusion(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    book = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(book, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    printed = "".join(o.get("text", "") for c in book.cells for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    assert "Conclusion:" in printed
