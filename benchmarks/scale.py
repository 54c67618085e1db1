"""Scale benchmark: one training step from 64 to 65,536 GPUs at every fidelity.

Prints one row per (model, GPUs, fidelity): the plan, the simulated step time,
the wall time of the simulation, the SimPy events processed (``event`` and
``flow``; the engine spends one event on a run of ops whose durations are known,
so events are fewer than ops), the ops replayed (``analytic``: ops list-scheduled),
both per second, and the peak RSS of the process that ran it. Each run is a fresh
process, so RSS is its own.

Plans: ``llama3-405b`` at tp 8, pp 16 (fewer when the GPUs do not fill them), seq
8192; ``gpt3-175b`` at tp 8, pp 8, seq 2048; dp fills the GPUs; 16 micro-batches
of one sequence per pipeline (at 16,384 GPUs, llama3-405b runs the issue's global
batch of 2,048). Memory is not checked: this measures the simulator, not the plan.

Beyond the preset's largest job (dgx-h100: 2,048 nodes, 16,384 GPUs) the preset's
``max_nodes`` is raised to fit (rows above 16,384 GPUs): the fabric keeps its shape
(two tiers; leaves of 32 nodes per rail), which is what the benchmark needs to
measure cost against GPU count.

After the table, the fitted exponent ``k`` of ``wall_s ~ gpus^k`` per model and
fidelity (least squares on log-log, over the rows that finished): issue 16 asks that
cost grow with distinct rank classes and layer shapes, never with GPU count (k near 0).

The output format is stable (fixed columns; ``--csv`` writes the same rows) so
runs can be compared. Usage::

    python benchmarks/scale.py                      # everything (flow at 16k is slow)
    python benchmarks/scale.py --fidelities analytic,event --max-gpus 16384
    python benchmarks/scale.py --models llama3-405b --csv scale.csv
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {"llama3-405b": dict(seq_len=8192, tp=8, pp=16),
          "gpt3-175b": dict(seq_len=2048, tp=8, pp=8)}
FIDELITIES = ("analytic", "event", "flow")
MICROBATCHES = 16
COLUMNS = ("model", "gpus", "tp", "pp", "dp", "fidelity", "step_s", "wall_s", "events",
           "events_per_s", "ops", "ops_per_s", "peak_rss_MiB")


def plan_for(model: str, gpus: int) -> dict:
    """tp, pp, dp, seq_len and global batch of a row."""
    shape = MODELS[model]
    tp = shape["tp"]
    pp = max(1, min(shape["pp"], gpus // tp))
    dp = gpus // (tp * pp)
    return dict(tp=tp, pp=pp, dp=dp, seq_len=shape["seq_len"], micro_batch=1,
                global_batch=MICROBATCHES * dp)


def run_one(model: str, gpus: int, fidelity: str) -> dict:
    """Simulate one step in this process; return its measurements."""
    from hardware.catalog import load_cluster
    from trainsim.api import make_plan
    from sim.step import simulate_step
    from strategies.models import load_model

    from dataclasses import replace

    spec, cluster = load_model(model), load_cluster("dgx-h100")
    nodes = gpus // cluster.gpus_per_node
    if nodes > cluster.max_nodes:  # beyond the preset: the same fabric, more of it
        cluster = replace(cluster, max_nodes=nodes)
    plan = make_plan(gpus=gpus, **plan_for(model, gpus))
    start = time.perf_counter()
    result = simulate_step(spec, cluster, plan, fidelity=fidelity, check_memory=False)
    wall_s = time.perf_counter() - start
    return {"step_s": result.step_time_s, "wall_s": wall_s,
            "events": result.stats.get("events"),
            "ops": result.stats.get("ops", result.stats.get("ops_priced")),
            "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(model: str, gpus: int, fidelity: str, timeout_s: float) -> dict:
    """Run :func:`run_one` in a fresh process (its own peak RSS)."""
    command = [sys.executable, __file__, "--one", model, str(gpus), fidelity]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              check=True)
    except subprocess.TimeoutExpired:
        return {"step_s": None, "wall_s": f">{timeout_s:.0f}", "events": None, "ops": None,
                "peak_rss_MiB": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def fitted_exponents(rows: list[dict]) -> list[tuple[tuple[str, str], float, int]]:
    """Per (model, fidelity): the least-squares slope of log(wall_s) on log(gpus) over
    the rows that finished (a float wall time), and how many rows it fits; groups with
    fewer than two such rows are left out."""
    import math

    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in rows:
        if isinstance(row["wall_s"], float) and row["wall_s"] > 0:
            groups.setdefault((row["model"], row["fidelity"]), []).append(
                (math.log(row["gpus"]), math.log(row["wall_s"])))
    out = []
    for key, points in groups.items():
        if len(points) < 2:
            continue
        mean_x = sum(x for x, _ in points) / len(points)
        mean_y = sum(y for _, y in points) / len(points)
        sxx = sum((x - mean_x) ** 2 for x, _ in points)
        sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
        out.append((key, sxy / sxx, len(points)))
    return out


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if value < 1e5 else f"{value:.3e}"
    return str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fidelities", default=",".join(FIDELITIES))
    parser.add_argument("--min-gpus", type=int, default=64)
    parser.add_argument("--max-gpus", type=int, default=65536)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--csv", help="also write the rows here (atomically, at the end)")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "GPUS", "FIDELITY"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        model, gpus, fidelity = args.one
        print(json.dumps(run_one(model, int(gpus), fidelity)))
        return
    rows = []
    print(" ".join(f"{c:>13s}" for c in COLUMNS), flush=True)
    for model in args.models.split(","):
        gpus = args.min_gpus
        while gpus <= args.max_gpus:
            shape = plan_for(model, gpus)
            for fidelity in args.fidelities.split(","):
                row = {"model": model, "gpus": gpus, "tp": shape["tp"], "pp": shape["pp"],
                       "dp": shape["dp"], "fidelity": fidelity,
                       **measure(model, gpus, fidelity, args.timeout)}
                wall = row["wall_s"]
                for work in ("events", "ops"):
                    row[f"{work}_per_s"] = (row[work] / wall if row[work] and isinstance(wall, float)
                                            else None)
                rows.append(row)
                print(" ".join(f"{_cell(row[c]):>13s}" for c in COLUMNS), flush=True)
            gpus *= 2
    print()
    print(f"{'model':>13s} {'fidelity':>13s} {'rows':>5s} {'exponent':>9s}  (wall_s ~ gpus^k)")
    for (model, fidelity), k, count in fitted_exponents(rows):
        print(f"{model:>13s} {fidelity:>13s} {count:>5d} {k:>9.3f}")
    if args.csv:
        import pandas as pd

        from sim.atomic_io import write_text_atomic

        write_text_atomic(args.csv, pd.DataFrame(rows, columns=list(COLUMNS)).to_csv(index=False))


if __name__ == "__main__":
    main()
