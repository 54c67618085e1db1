"""Execute the what-if notebooks and save the executed copies under notebooks/executed/.

The copies keep every output, with plotly figures as static PNG images (plotly's ``png``
renderer, through kaleido and a local Chrome or Chromium), so a reader of the repository
sees the figures without running anything: repository browsers show PNG outputs but not
plotly's JavaScript ones. The code cells are the notebooks' own, unchanged
(tests/test_notebooks.py checks that the copies match them).

Run it after changing a notebook or the simulator's numbers::

    python -m pip install -e ".[notebooks]"
    python notebooks/render.py            # all; or give notebook paths

Needs the ``notebooks`` extra (jupyter, kaleido) and Chrome or Chromium on the machine
(Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
OUT = HERE / "executed"
#: Size of the static figures, in CSS pixels.
WIDTH_PX, HEIGHT_PX = 900, 500
#: Run first, in the same kernel, and dropped from the saved copy: figures as PNG.
SETUP = ("import plotly.io as pio\n"
         "pio.renderers.default = 'png'\n"
         f"pio.renderers['png'].width, pio.renderers['png'].height = {WIDTH_PX}, {HEIGHT_PX}")


def render(path: Path) -> Path:
    """Execute ``path`` and write its executed copy atomically; return the copy's path.

    Raises:
        nbclient.exceptions.CellExecutionError: when a cell fails (its conclusion's
            assertion included); nothing is written then.
    """
    book = nbformat.read(path, as_version=4)
    book.cells.insert(0, nbformat.v4.new_code_cell(SETUP))
    NotebookClient(book, timeout=900, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    book.cells.pop(0)
    for number, cell in enumerate((c for c in book.cells if c.cell_type == "code"), 1):
        cell.execution_count = number  # as if run top to bottom without the setup cell
        for output in cell.get("outputs", []):
            if "execution_count" in output:
                output["execution_count"] = number
    OUT.mkdir(exist_ok=True)
    target = OUT / path.name
    temporary = target.with_suffix(".ipynb.tmp")
    nbformat.write(book, temporary)
    os.replace(temporary, target)
    return target


def main(argv: list[str]) -> None:
    """Render the notebooks named in ``argv``, or all of notebooks/*.ipynb."""
    paths = [Path(a).resolve() for a in argv] or sorted(HERE.glob("*.ipynb"))
    for path in paths:
        target = render(path)
        print(f"{path.name} -> {target.relative_to(HERE.parent)} "
              f"({target.stat().st_size / 1e3:,.0f} kB)")


if __name__ == "__main__":
    main(sys.argv[1:])
