"""``trainsim sweep``: what-if grids of scenarios, one tidy table, on processes or Ray."""

from __future__ import annotations

from typing import Optional

import typer

from trainsim import defaults
from trainsim.cli.errors import check_choice, check_output_dir, check_output_path
from trainsim.cli.output import comment, console, progress, progress_callback


def register(app: typer.Typer) -> None:
    """Add the ``sweep`` command to ``app``."""
    app.command()(sweep)


def sweep(
    spec: str = typer.Argument(..., help="Sweep spec YAML (see README: base, grid, "
                               "scenarios)."),
    out: str = typer.Option(..., help="Results table: .parquet or .csv."),
    backend: str = typer.Option("local", help="local (processes) or ray."),
    workers: Optional[int] = typer.Option(None, help="Parallel workers (local: processes; "
                                          "default: CPUs)."),
    address: Optional[str] = typer.Option(None, help="Ray cluster address (ray backend; "
                                          "default: start a local instance)."),
    cache: Optional[str] = typer.Option(None, help="Cache directory (default: OUT.cache)."),
    fresh: bool = typer.Option(False, help="Ignore cached results."),
) -> None:
    """Run a grid or list of scenarios; results as one tidy table, resumable."""
    from trainsim import sweeps

    check_choice("backend", backend, sweeps.BACKENDS)
    sweeps.resolve_workers(workers)
    scenarios = sweeps.load_spec(spec)
    check_output_path("out", out)
    check_output_dir("cache", cache if cache is not None else f"{out}.cache")
    err = console(stderr=True)
    kinds = sorted({s["kind"] for s in scenarios})
    comment(err, f"# {len(scenarios)} scenarios ({', '.join(kinds)}); where a scenario does not "
                 f"say: cluster {defaults.CLUSTER}, no calibration, seq_len {defaults.SEQ_LEN:,}, "
                 f"global batch ~{defaults.TOKENS_PER_STEP / 2**20:g} Mi tokens, zero "
                 f"{defaults.ZERO}, DP gradient reduction overlapped with backward; fidelity "
                 f"{defaults.SWEEP_FIDELITY} (steps), {defaults.COLLECTIVE_FIDELITY} "
                 "(collectives); the table records the values used")
    with progress(True) as bar:
        summary = sweeps.run_sweep(scenarios, out, backend=backend, workers=workers,
                                   address=address, cache_dir=cache, fresh=fresh,
                                   progress=progress_callback(bar),
                                   warn=lambda line: err.print(f"warning: {line}",
                                                               markup=False, highlight=False))
    err.print(f"{summary['scenarios']} scenarios: {summary['computed']} computed, "
              f"{summary['cached']} from cache, {summary['failed']} failed -> {out}")
    for axis in summary["unchanged_axes"]:
        err.print(f"warning: {sweeps.unchanged_message(axis)}")
