"""Golden outputs: three small scenarios whose whole JSON output is pinned, byte for byte.

Any change of a number the simulator prints for them fails ``tests/test_golden.py``. When
a change is intended (new physics, a recalibration), regenerate the files and let the diff
show what moved::

    python tests/golden_cases.py --update

Each case is the argv of a ``trainsim`` command with ``--format json``; the file
``tests/golden/<name>.json`` holds its standard output.
"""

from __future__ import annotations

import argparse
import io
import sys
from contextlib import redirect_stdout
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"

#: name -> argv (after ``trainsim``).
CASES: dict[str, list[str]] = {
    "collective_all_reduce_2x_dgx_h100": [
        "collective", "all_reduce", "--cluster", "dgx-h100", "--nodes", "2",
        "--min-bytes", "1M", "--max-bytes", "1G", "--format", "json"],
    "simulate_llama3_8b_tp2_pp2_event": [
        "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
        "--tp", "2", "--pp", "2", "--global-batch", "32", "--seq-len", "4096",
        "--fidelity", "event", "--format", "json"],
    "failures_llama3_70b_1024_gpus": [
        "failures", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "1024",
        "--tp", "8", "--pp", "4", "--global-batch", "512", "--days", "7", "--seeds", "8",
        "--seed", "1", "--format", "json"],
}


def run_case(argv: list[str]) -> str:
    """Standard output of ``trainsim <argv>`` run in-process.

    Raises:
        RuntimeError: the command exits non-zero.
    """
    from trainsim.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise RuntimeError(f"trainsim {' '.join(argv)} exited {stop.code}") from None
    return out.getvalue()


def update() -> None:
    """Rewrite every golden file (atomically)."""
    from sim.atomic_io import write_text_atomic

    GOLDEN.mkdir(exist_ok=True)
    for name, argv in CASES.items():
        text = run_case(argv)
        write_text_atomic(GOLDEN / f"{name}.json", text)
        print(f"wrote {GOLDEN / f'{name}.json'} ({len(text):,} characters)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the golden files")
    if not parser.parse_args().update:
        parser.error("nothing to do; pass --update to rewrite the golden files")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    update()
